package checkpoint

import (
	"errors"
	"fmt"

	"gorgonia.org/tensor"
)

// ErrNonFinite is wrapped by CheckFinite's error.
var ErrNonFinite = errors.New("checkpoint: tensor holds NaN or infinite values")

// CheckFinite returns an error wrapping ErrNonFinite, naming the first
// tensor, element and value at fault and how many such values it holds,
// when a floating-point tensor in tensors holds a NaN or an infinity. A
// training loop calls it before Save so that a diverged run never writes a
// checkpoint over its last good one (Save itself writes any values, since
// some tensors hold infinities on purpose, such as attention masks).
func CheckFinite(tensors []Named) error {
	for _, nt := range tensors {
		t := nt.Tensor
		if t == nil {
			continue
		}
		if t.RequiresIterator() || t.IsView() {
			if m, ok := t.Materialize().(*tensor.Dense); ok {
				t = m
			}
		}
		first, n := -1, 0
		var val float64
		note := func(i int, v float64) {
			if first < 0 {
				first, val = i, v
			}
			n++
		}
		switch d := elems(t).(type) {
		case []float64:
			for i, v := range d {
				if v-v != 0 { // NaN and ±Inf
					note(i, v)
				}
			}
		case []float32:
			for i, v := range d {
				if v-v != 0 {
					note(i, float64(v))
				}
			}
		}
		if n > 0 {
			return fmt.Errorf("%w: %q (shape %v) holds %v at element %d, and %d non-finite value(s) in all", ErrNonFinite, nt.Name, shapeList(t), val, first, n)
		}
	}
	return nil
}
