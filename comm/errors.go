package comm

import (
	"errors"
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

// Sentinel errors returned (wrapped) by process groups, transports and
// rendezvous. Test with errors.Is.
var (
	ErrTimeout  = errs.Timeout
	ErrPeerLost = errs.PeerLost
	// ErrPeerAborted is the ErrPeerLost of a peer that aborted and said so,
	// sending its cause along (the tcp, shm and local transports).
	ErrPeerAborted     = errs.PeerAborted
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

// ErrSharedUnavailable is returned (wrapped) by NewSharedTensor when rank 0
// could not create the shared segment or a member could not map it (a
// /dev/shm too small for it, a sandbox without one). Every member of the
// group gets it from the same call and none keeps the segment, so the
// members can agree to use an ordinary tensor instead.
var ErrSharedUnavailable = errors.New("the shared segment is unavailable")
