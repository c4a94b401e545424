// Package errs holds the sentinel errors that every layer of Tandem shares, so
// that errors.Is(err, comm.ErrTimeout) holds whether the timeout happened in a
// store, a transport, a collective or an RPC. Users reach them through the
// re-exports in comm, comm/store and rpc.
package errs

import "errors"

var (
	// Timeout: a deadline (the context's or a configured default) expired.
	Timeout = errors.New("tandem: timeout")
	// PeerLost: a peer process died, closed its side or became unreachable.
	PeerLost = errors.New("tandem: peer lost")
	// PeerAborted: a peer aborted and said so (a PeerLost too, with the
	// same message): its own cause, which it sent along, explains it.
	PeerAborted = Kind(PeerLost.Error(), PeerLost)
	// Closed: the object (store, group, agent) was closed by its owner.
	Closed = errors.New("tandem: closed")
	// Mismatch: two sides disagree about what they share: ranks about a
	// collective (its fingerprint, a world size, a message length), a
	// checkpoint file about the model it is loaded into.
	Mismatch = errors.New("tandem: mismatch between ranks")
	// InvalidArgument: the caller passed something that cannot work.
	InvalidArgument = errors.New("tandem: invalid argument")
	// Unauthorized: a peer presented a wrong or missing token.
	Unauthorized = errors.New("tandem: unauthorized")
	// TooLarge: a frame, value or message exceeds the configured size limit.
	TooLarge = errors.New("tandem: too large")
)

// Kind returns a new sentinel error with message msg that is also parent:
// errors.Is(Kind(msg, parent), parent) holds. A package uses it for an error
// of its own that belongs to a shared kind (checkpoint.ErrMismatch is a
// Mismatch), so that callers may test for either.
func Kind(msg string, parent error) error { return &kind{msg: msg, parent: parent} }

type kind struct {
	msg    string
	parent error
}

func (k *kind) Error() string { return k.msg }
func (k *kind) Unwrap() error { return k.parent }
