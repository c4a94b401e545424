package optim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// stateKey names buffer of parameter i in a state map.
func stateKey(i int, buffer string) string { return "state." + strconv.Itoa(i) + "." + buffer }

// loadedState is a state map checked against an optimizer's parameters.
type loadedState struct {
	bufs  []map[string]*tensor.Dense // per parameter: buffer name -> private copy
	steps []int64                    // per parameter: the "step" entry, -1 when absent
	lr    float64
	hasLR bool
}

// parseState checks every entry of state: known names only, buffers shaped
// and typed like their parameter, step a non-negative integer scalar, lr a
// finite scalar. Tensors are copied so the optimizer never aliases the map.
func parseState(opt string, params []*models.Param, state map[string]*tensor.Dense, buffers map[string]bool) (loadedState, error) {
	ls := loadedState{bufs: make([]map[string]*tensor.Dense, len(params)), steps: make([]int64, len(params))}
	for i := range ls.steps {
		ls.steps[i] = -1
	}
	for name, t := range state {
		if t == nil {
			return ls, fmt.Errorf("optim: %s: state entry %q is nil: %w", opt, name, ErrInvalidArgument)
		}
		if name == "param_groups.0.lr" {
			v, err := scalarOf(t)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return ls, fmt.Errorf("optim: %s: state entry %q must be one non-negative finite number: %w", opt, name, ErrInvalidArgument)
			}
			ls.lr, ls.hasLR = v, true
			continue
		}
		rest, ok := strings.CutPrefix(name, "state.")
		idx, buf, ok2 := strings.Cut(rest, ".")
		i, err := strconv.Atoi(idx)
		if !ok || !ok2 || err != nil || i < 0 || strconv.Itoa(i) != idx {
			return ls, fmt.Errorf("optim: %s: unknown state entry %q (expected state.<i>.<buffer> or param_groups.0.lr): %w",
				opt, name, ErrInvalidArgument)
		}
		if i >= len(params) {
			return ls, fmt.Errorf("optim: %s: state entry %q names parameter %d but the optimizer has %d parameters: %w",
				opt, name, i, len(params), ErrInvalidArgument)
		}
		if buf == "step" && buffers["step"] {
			v, err := scalarOf(t)
			if err != nil || v < 0 || v != math.Trunc(v) || v > 1<<53 {
				return ls, fmt.Errorf("optim: %s: state entry %q must be one non-negative integer: %w", opt, name, ErrInvalidArgument)
			}
			ls.steps[i] = int64(v)
			continue
		}
		if !buffers[buf] {
			return ls, fmt.Errorf("optim: %s: unknown state buffer %q in entry %q: %w", opt, buf, name, ErrInvalidArgument)
		}
		p := params[i].Value
		if !t.Shape().Eq(p.Shape()) || t.Dtype() != p.Dtype() {
			return ls, fmt.Errorf("optim: %s: state entry %q is %v %v but parameter %d (%q) is %v %v: %w",
				opt, name, t.Dtype(), t.Shape(), i, params[i].Name, p.Dtype(), p.Shape(), ErrInvalidArgument)
		}
		if _, err := elemSlices(t, p); err != nil {
			return ls, fmt.Errorf("optim: %s: state entry %q: %w", opt, name, err)
		}
		if ls.bufs[i] == nil {
			ls.bufs[i] = map[string]*tensor.Dense{}
		}
		ls.bufs[i][buf] = cloneDense(t)
	}
	return ls, nil
}

// scalarOf reads a one-element numeric tensor.
func scalarOf(t *tensor.Dense) (float64, error) {
	if !t.IsScalar() && t.Shape().TotalSize() != 1 {
		return 0, fmt.Errorf("want one element, got shape %v", t.Shape())
	}
	switch v := t.Get(0).(type) {
	case float64:
		return v, nil
	case float32:
		return float64(v), nil
	case int64:
		return float64(v), nil
	case int32:
		return float64(v), nil
	case int:
		return float64(v), nil
	}
	return 0, fmt.Errorf("dtype %v is not numeric", t.Dtype())
}
