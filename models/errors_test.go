package models

import (
	"errors"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// Errors from building and running a model wrap the shared sentinels, so
// that errors.Is(err, comm.ErrInvalidArgument) works on them as on errors
// from comm and checkpoint.
func TestErrorsWrapSharedSentinels(t *testing.T) {
	g := G.NewGraph()
	a := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("a"))
	b := G.NewMatrix(g, tensor.Float64, G.WithShape(4, 5), G.WithName("b"))
	c := G.NewMatrix(g, tensor.Float32, G.WithShape(3, 2), G.WithName("c"))
	v := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("v"))
	for name, err := range map[string]error{
		"inner sizes differ": second(MatMulT(a, b, 0)),
		"dtypes differ":      second(MatMulT(a, c, 0)),
		"not a matrix":       second(MatMulT(a, v, 0)),
		"bad layer sizes":    second(NewLinear(0, 3)),
		"bad activation":     second(NewActivation("swish")),
	} {
		if !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("%s: %v, want an error wrapping ErrInvalidArgument", name, err)
		}
	}
	// What is not implemented says so in the standard way.
	if _, err := (convGradXOp{}).SymDiff(nil, nil, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("second derivative of Conv2d: %v, want errors.ErrUnsupported", err)
	}
}

func second[T any](_ T, err error) error { return err }
