package graph

import (
	"errors"
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

// ErrPanic is wrapped by the error a Run returns when an op (or a hook)
// panicked. errors.As with *PanicError gives the panic value and the stack.
var ErrPanic = errors.New("graph: panic")

// ErrInvalidArgument is the shared Tandem sentinel for bad input (a binding to
// a node outside the program, a missing input value, a malformed option).
var ErrInvalidArgument = errs.InvalidArgument

// PanicError carries a panic recovered while running an op or a hook. It
// matches ErrPanic with errors.Is.
type PanicError struct {
	// Value is what the op passed to panic.
	Value any
	// Stack is the goroutine's stack at the moment of the panic.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Is reports whether target is ErrPanic.
func (e *PanicError) Is(target error) bool { return target == ErrPanic }

// Unwrap exposes the panic value when it is itself an error.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}
