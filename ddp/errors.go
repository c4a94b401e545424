package ddp

import "github.com/tandemml/tandem/comm"

// Sentinel errors, shared with comm (test with errors.Is). A dead peer shows
// up as comm.ErrPeerLost, an expired deadline as comm.ErrTimeout.
var (
	// ErrInvalidArgument: a bad option, input or model.
	ErrInvalidArgument = comm.ErrInvalidArgument
	// ErrMismatch: the ranks disagree (parameter names, shapes or dtypes,
	// no-sync or join state).
	ErrMismatch = comm.ErrMismatch
	// ErrClosed: the DDP is unusable because an earlier step failed and
	// aborted its process group.
	ErrClosed = comm.ErrClosed
)
