// Package transport is the small point-to-point interface that every collective
// algorithm in comm is written against once, and that backends (comm/tcp,
// comm/local, later shared memory and MPI) implement: the driver side of comm,
// as database/sql/driver is to database/sql.
package transport

import (
	"context"
	"fmt"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/errs"
)

// Sentinel errors, shared with comm (comm.ErrPeerLost == transport.ErrPeerLost).
var (
	ErrTimeout         = errs.Timeout
	ErrPeerLost        = errs.PeerLost
	ErrPeerAborted     = errs.PeerAborted
	ErrClosed          = errs.Closed
	ErrMismatch        = errs.Mismatch
	ErrInvalidArgument = errs.InvalidArgument
	ErrUnauthorized    = errs.Unauthorized
	ErrTooLarge        = errs.TooLarge
)

// Config is what a backend needs to connect one rank to its peers.
type Config struct {
	Rank, Size int
	// Store is the rendezvous store that ranks exchange addresses through.
	// Keys a backend writes must be under its own prefix.
	Store store.Store
	// Timeout bounds connection set-up when the context has no deadline.
	Timeout time.Duration
	// Token, when not empty, must be presented by every peer at connect.
	Token string
	// MaxMessage bounds one message's size in bytes (0: backend default).
	MaxMessage int64
	// PeerTimeout is how long a peer may stay silent before the backend
	// counts it as unresponsive and fails operations with it (ErrPeerLost);
	// 0 means the backend's default, a negative value no check. Backends
	// whose ranks cannot freeze apart (goroutines in one process) ignore it.
	PeerTimeout time.Duration
}

// Validate checks what every backend needs of cfg before it connects: a
// world of at least one rank and at most maxSize (no bound when maxSize is
// not positive), a rank inside it, a rendezvous store when there are peers
// and a MaxMessage that is not negative. Errors wrap ErrInvalidArgument and
// start with backend ("tcp: ...").
func (cfg Config) Validate(backend string, maxSize int) error {
	switch {
	case cfg.Size < 1:
		return fmt.Errorf("%s: world size %d: must be at least 1: %w", backend, cfg.Size, ErrInvalidArgument)
	case maxSize > 0 && cfg.Size > maxSize:
		return fmt.Errorf("%s: world size %d: exceeds the %d ranks this backend supports: %w", backend, cfg.Size, maxSize, ErrInvalidArgument)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return fmt.Errorf("%s: rank %d out of range for world size %d (ranks are 0..%d): %w",
			backend, cfg.Rank, cfg.Size, cfg.Size-1, ErrInvalidArgument)
	case cfg.Size > 1 && cfg.Store == nil:
		return fmt.Errorf("%s: a world of %d ranks needs a rendezvous store in transport.Config.Store: %w",
			backend, cfg.Size, ErrInvalidArgument)
	case cfg.MaxMessage < 0:
		return fmt.Errorf("%s: MaxMessage %d is negative: %w", backend, cfg.MaxMessage, ErrInvalidArgument)
	}
	return nil
}

// Upcast returns a backend's concrete transport as a Transport, and a nil
// Transport with err when err is not nil, so that a failed Connect never
// returns a non-nil interface that holds a nil pointer:
//
//	func (b Backend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
//		return transport.Upcast(b.connectConcrete(ctx, cfg))
//	}
func Upcast[T Transport](t T, err error) (Transport, error) {
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Backend builds a Transport for one rank; backends register themselves with
// comm.Register under a name ("tcp", "local").
type Backend interface {
	Connect(ctx context.Context, cfg Config) (Transport, error)
}

// Tag labels a point-to-point message so that concurrent collectives and
// user Send/Recv calls never take each other's messages. The comm layer builds
// tags from the group id, the group's sequence number and the step within an
// algorithm; transports treat them as opaque.
type Tag uint64

// Transport moves tagged byte messages between the ranks of one world. It is
// the small point-to-point interface that every collective algorithm is written
// against once; backends (comm/tcp, comm/local, later shared memory and MPI)
// implement it.
//
// Ordering: messages from one peer under one tag arrive in the order sent.
// A message that arrives before its Recv is posted is buffered by the transport.
// Implementations are safe for concurrent use: many Sends and Recvs (to other
// peers or under other tags) may be in flight at once.
type Transport interface {
	// Rank is this process's rank in the world, Size the number of ranks.
	Rank() int
	Size() int
	// Send delivers buf to peer under tag. When it returns, buf may be reused.
	// Sending to oneself is allowed.
	//
	// Send and Recv honour ctx under the rule of every package of comm: a
	// deadline gives an error wrapping ErrTimeout and
	// context.DeadlineExceeded, a cancellation one wrapping context.Canceled
	// (not ErrTimeout), and a nil ctx is refused with ErrInvalidArgument.
	Send(ctx context.Context, peer int, tag Tag, buf []byte) error
	// Recv receives into buf the next message that peer sent under tag. The
	// message must be exactly len(buf) bytes long; otherwise Recv returns an
	// error wrapping ErrMismatch that states both lengths.
	Recv(ctx context.Context, peer int, tag Tag, buf []byte) error
	// Abort fails every pending and future operation with an error wrapping
	// cause, and tells every peer that this rank aborted (so their operations
	// involving this rank fail with ErrPeerLost instead of waiting).
	Abort(cause error)
	// Close releases connections and goroutines; pending operations fail with
	// ErrClosed.
	Close() error
}

// OneHost is implemented by transports whose ranks all run on one host
// (shared memory, in-process), so that they can share memory outside the
// transport: comm maps its shared tensors (ProcessGroup.NewSharedTensor)
// only over a transport that says so.
type OneHost interface {
	// OneHost reports whether every rank of the world runs on this host.
	OneHost() bool
}
