package autograd

import (
	"errors"

	"github.com/tandemml/tandem/internal/errs"
)

// Sentinel errors; test with errors.Is. The shared ones are the same values
// as rpc.ErrTimeout, rpc.ErrPeerLost, and so on.
var (
	ErrTimeout         = errs.Timeout
	ErrPeerLost        = errs.PeerLost
	ErrClosed          = errs.Closed
	ErrInvalidArgument = errs.InvalidArgument
)

var (
	// ErrAborted: the backward pass was stopped because it failed on another
	// worker (the error's text names the worker and the cause).
	ErrAborted = errors.New("autograd: backward pass aborted")
	// ErrUnknownContext: no distributed autograd context with that id lives
	// on the worker (it ended, was released, or never reached this worker).
	// Also matches ErrInvalidArgument.
	ErrUnknownContext = errors.New("autograd: unknown context")
	// ErrForwardFailed: an RPC made inside the context failed during the
	// forward pass, so the graph is incomplete and Backward refuses to run.
	ErrForwardFailed = errors.New("autograd: a call in the forward pass failed")
)

// unknownContext wraps both ErrUnknownContext and ErrInvalidArgument.
type unknownContextError struct{ msg string }

func (e *unknownContextError) Error() string { return e.msg }
func (e *unknownContextError) Unwrap() []error {
	return []error{ErrUnknownContext, ErrInvalidArgument}
}
