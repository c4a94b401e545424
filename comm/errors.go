package comm

import "github.com/tandemml/tandem/internal/errs"

// Sentinel errors returned (wrapped) by process groups, transports and
// rendezvous. Test with errors.Is.
var (
	ErrTimeout         = errs.Timeout
	ErrPeerLost        = errs.PeerLost
	ErrClosed          = errs.Closed
	ErrMismatch        = errs.Mismatch
	ErrInvalidArgument = errs.InvalidArgument
	ErrUnauthorized    = errs.Unauthorized
	ErrTooLarge        = errs.TooLarge
)
