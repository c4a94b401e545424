package comm

import (
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

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

// ErrNotMember is returned by every operation called on the handle that a
// rank receives from NewGroup, NewSubgroups, NewSubgroupsByEnumeration or
// Split for a group it does not belong to. It wraps ErrInvalidArgument.
var ErrNotMember = fmt.Errorf("comm: this rank is not a member of the process group: %w", errs.InvalidArgument)
