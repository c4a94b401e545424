package optim

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// Optimizer updates a fixed list of parameters from their gradients.
type Optimizer interface {
	// Step applies one update to every parameter whose Grad is not nil. It
	// fails, changing nothing, when a gradient's dtype or shape does not match
	// its parameter or a tensor is neither float32 nor float64.
	Step() error
	// ZeroGrad writes zeros into every non-nil Grad (torch 1.13's
	// zero_grad(set_to_none=False)); nil grads stay nil.
	ZeroGrad()
	// LR is the current learning rate.
	LR() float64
	// SetLR changes the learning rate used by the next Step (schedulers call it).
	SetLR(lr float64)
	// Params returns the parameters the optimizer was built over, in order.
	Params() []*models.Param
	// State returns copies of the optimizer's state as named tensors:
	// "state.<i>.<buffer>" for parameter i (the index into Params) and
	// "param_groups.0.lr" (a float64 scalar). Parameters that have not yet
	// been stepped have no entries.
	State() map[string]*tensor.Dense
	// LoadState replaces the optimizer's state with a map laid out as State
	// returns it. A parameter with no entries starts afresh. Unknown names,
	// missing buffers and shape or dtype mismatches are errors wrapping
	// ErrInvalidArgument, and leave the optimizer unchanged.
	LoadState(state map[string]*tensor.Dense) error
}

// float is the element type of the update kernels.
type float interface{ ~float32 | ~float64 }

// base holds what every optimizer shares: its parameters and learning rate.
type base struct {
	name   string
	params []*models.Param
	lr     float64
}

func newBase(name string, params []*models.Param) (base, error) {
	for i, p := range params {
		if p == nil {
			return base{}, fmt.Errorf("optim: %s: parameter %d is nil: %w", name, i, ErrInvalidArgument)
		}
		if p.Value == nil {
			return base{}, fmt.Errorf("optim: %s: parameter %d (%q) has no Value: %w", name, i, p.Name, ErrInvalidArgument)
		}
		if _, err := elemSlices(p.Value, nil); err != nil {
			return base{}, fmt.Errorf("optim: %s: parameter %d (%q): %w", name, i, p.Name, err)
		}
	}
	return base{name: name, params: append([]*models.Param(nil), params...)}, nil
}

func (b *base) LR() float64             { return b.lr }
func (b *base) SetLR(lr float64)        { b.lr = lr }
func (b *base) Params() []*models.Param { return append([]*models.Param(nil), b.params...) }

// ZeroGrad writes zeros into every non-nil gradient.
func (b *base) ZeroGrad() {
	for _, p := range b.params {
		if p.Grad != nil {
			p.Grad.Zero()
		}
	}
}

// checkGrad verifies that p's gradient can be applied to its value.
func (b *base) checkGrad(i int, p *models.Param) error {
	if !p.Grad.Shape().Eq(p.Value.Shape()) {
		return fmt.Errorf("optim: %s: parameter %d (%q) has shape %v but its gradient has shape %v: %w",
			b.name, i, p.Name, p.Value.Shape(), p.Grad.Shape(), ErrInvalidArgument)
	}
	if p.Grad.Dtype() != p.Value.Dtype() {
		return fmt.Errorf("optim: %s: parameter %d (%q) is %v but its gradient is %v: %w",
			b.name, i, p.Name, p.Value.Dtype(), p.Grad.Dtype(), ErrInvalidArgument)
	}
	if _, err := elemSlices(p.Grad, p.Value); err != nil {
		return fmt.Errorf("optim: %s: gradient of parameter %d (%q): %w", b.name, i, p.Name, err)
	}
	return nil
}

// lrState is the learning rate as it appears in State.
func (b *base) lrState(m map[string]*tensor.Dense) {
	m["param_groups.0.lr"] = tensor.New(tensor.FromScalar(b.lr))
}

// elemSlices checks that t is a contiguous float32 or float64 tensor (of the
// same size as like, when like is not nil) and returns its backing slice as
// []float32 or []float64.
func elemSlices(t, like *tensor.Dense) (any, error) {
	if t.RequiresIterator() {
		return nil, fmt.Errorf("tensor of shape %v is a strided or masked view; pass a contiguous tensor (Materialize it): %w",
			t.Shape(), ErrInvalidArgument)
	}
	var s any
	var n int
	switch t.Dtype() {
	case tensor.Float64:
		x := t.Float64s()
		s, n = x, len(x)
	case tensor.Float32:
		x := t.Float32s()
		s, n = x, len(x)
	default:
		return nil, fmt.Errorf("tensor has dtype %v; optimizers handle float32 and float64: %w", t.Dtype(), ErrInvalidArgument)
	}
	if want := t.Shape().TotalSize(); !t.IsScalar() && n != want {
		return nil, fmt.Errorf("tensor of shape %v is backed by %d elements; pass a contiguous tensor: %w", t.Shape(), n, ErrInvalidArgument)
	}
	if like != nil {
		_, m := sliceLen(like)
		if m != n {
			return nil, fmt.Errorf("tensor holds %d elements, its parameter %d: %w", n, m, ErrInvalidArgument)
		}
	}
	return s, nil
}

func sliceLen(t *tensor.Dense) (any, int) {
	if t.Dtype() == tensor.Float32 {
		x := t.Float32s()
		return x, len(x)
	}
	x := t.Float64s()
	return x, len(x)
}

// zerosLike returns a new tensor of v's shape and dtype filled with zeros.
func zerosLike(v *tensor.Dense) *tensor.Dense {
	z := v.Clone().(*tensor.Dense)
	z.Zero()
	return z
}

// cloneDense returns a deep copy of t.
func cloneDense(t *tensor.Dense) *tensor.Dense { return t.Clone().(*tensor.Dense) }

// fma returns a*b+c rounded once, as a hardware fused multiply-add (and
// PyTorch's vectorized kernels) compute it.
func fma[T float](a, b, c T) T {
	if unsafe.Sizeof(a) == 4 {
		return T(fma32(float32(a), float32(b), float32(c)))
	}
	return T(math.FMA(float64(a), float64(b), float64(c)))
}

// fma32 is the float32 fused multiply-add, rounded once. The product of two
// float32 values is exact in float64; the sum with c is rounded to float64
// and its error recovered exactly (Knuth's TwoSum). Rounding that float64
// to float32 would round twice, which goes wrong when the first rounding
// lands on a float32 halfway point; rounding the float64 to odd instead
// (an inexact result keeps its last bit set) makes the second rounding
// exact, float64 having more than two bits to spare below every float32.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	bp := s - p
	err := (p - (s - bp)) + (float64(c) - bp)
	if err != 0 && !math.IsInf(s, 0) && !math.IsNaN(err) {
		if bits := math.Float64bits(s); bits&1 == 0 {
			if (err > 0) == (s > 0) {
				bits++ // one ulp away from zero, toward the exact sum
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}

// sqrt is the correctly rounded square root in T.
func sqrt[T float](x T) T { return T(math.Sqrt(float64(x))) }

// maximum is torch.maximum: NaN if either side is NaN, else the larger.
func maximum[T float](a, b T) T {
	switch {
	case a != a:
		return a
	case b != b:
		return b
	case a > b:
		return a
	}
	return b
}
