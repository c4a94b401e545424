package store

import (
	"context"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// Sentinel errors; test with errors.Is.
var (
	ErrTimeout         = errs.Timeout
	ErrClosed          = errs.Closed
	ErrTooLarge        = errs.TooLarge
	ErrUnauthorized    = errs.Unauthorized
	ErrInvalidArgument = errs.InvalidArgument
	// ErrPeerLost: a TCP store client lost its connection to the server and
	// could not open a new one before the call's deadline (wrapped together
	// with ErrTimeout).
	ErrPeerLost = errs.PeerLost
)

// DefaultTimeout bounds blocking calls whose context carries no deadline.
const DefaultTimeout = 5 * time.Minute

// Store is the key-value store contract shared by every implementation.
// Values are opaque bytes. Implementations are safe for concurrent use.
type Store interface {
	// Set stores value under key, waking any Get or Wait blocked on it.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns the value of key, blocking until the key exists or the
	// timeout expires (ErrTimeout).
	Get(ctx context.Context, key string) ([]byte, error)
	// Add adds delta to the integer counter stored under key (a missing key
	// counts as 0) and returns the new value. Counters are stored as decimal
	// text, as c10d does.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareSet sets key to desired if its current value equals expected, or
	// if the key is absent and expected is empty. It returns the value stored
	// under key afterwards (desired on success, the current value otherwise;
	// expected when the key is absent and expected is not empty).
	CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
	// DeleteKey removes key and reports whether it existed.
	DeleteKey(ctx context.Context, key string) (bool, error)
	// NumKeys returns the number of keys stored.
	NumKeys(ctx context.Context) (int64, error)
	// Check reports whether every key exists, without blocking.
	Check(ctx context.Context, keys []string) (bool, error)
	// Wait blocks until every key exists. A zero timeout means the store's
	// default; the context's deadline applies as well.
	Wait(ctx context.Context, keys []string, timeout time.Duration) error
	// MultiSet sets several keys at once.
	MultiSet(ctx context.Context, keys []string, values [][]byte) error
	// MultiGet gets several keys, blocking until all exist.
	MultiGet(ctx context.Context, keys []string) ([][]byte, error)
	// Append appends value to the bytes stored under key (creating it).
	Append(ctx context.Context, key string, value []byte) error
	// Close releases the store's resources. Calls after Close return ErrClosed.
	Close() error
}
