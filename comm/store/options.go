package store

import (
	"log/slog"
	"os"
	"time"

	"github.com/tandemml/tandem/launch"
)

// TokenEnv names the environment variable that supplies the default shared
// secret of TCP stores when WithToken is not given: launch.TokenEnv.
const TokenEnv = launch.TokenEnv

// Default size limits of the TCP store protocol.
const (
	// DefaultMaxValue bounds one value (and the sum of MultiSet's values).
	DefaultMaxValue = 64 << 20
	// DefaultMaxFrame bounds one protocol frame: a value plus room for keys.
	DefaultMaxFrame = DefaultMaxValue + 1<<20
)

// Option configures a store, a TCP store server or a TCP store client.
// Options that do not apply to a kind of store are ignored by it.
type Option func(*config)

type config struct {
	timeout  time.Duration
	token    string
	tokenSet bool
	maxFrame int
	maxValue int
	logger   *slog.Logger
	poll     time.Duration
	observer Observer

	maxPending, maxPendingPerHost int
}

func newConfig(opts []Option) config {
	c := config{
		timeout:  DefaultTimeout,
		maxFrame: DefaultMaxFrame,
		maxValue: DefaultMaxValue,
		poll:     50 * time.Millisecond,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if !c.tokenSet {
		c.token = os.Getenv(TokenEnv)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.maxValue > c.maxFrame-frameOverhead {
		c.maxValue = c.maxFrame - frameOverhead
	}
	return c
}

// WithTimeout sets the default timeout of blocking calls (Get, Wait, MultiGet)
// whose context carries no earlier deadline, and the bound on how long a TCP
// client keeps trying to reach its server. Non-positive values are ignored.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithToken sets the shared secret of TCP store clients and servers. Both
// sides prove that they know it with a challenge-response (the token itself
// never crosses the wire). Without it the value of the TANDEM_TOKEN
// environment variable is used. A server with an empty token accepts every
// client; a client with a token refuses a server without one, since such a
// server cannot prove it is the job's store.
func WithToken(token string) Option {
	return func(c *config) {
		c.token = token
		c.tokenSet = true
	}
}

// WithMaxFrame bounds the size in bytes of one TCP store protocol frame. A
// peer that announces a larger frame is disconnected. Values below 4 KiB are
// raised to 4 KiB.
func WithMaxFrame(n int) Option {
	return func(c *config) {
		c.maxFrame = max(n, 4<<10)
	}
}

// WithMaxValue bounds the size in bytes of one value sent to a TCP store
// (the sum of the values for MultiSet). Larger values are refused with an
// error wrapping ErrTooLarge. It never exceeds the frame limit.
func WithMaxValue(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxValue = n
		}
	}
}

// WithMaxPending bounds how many connections a TCP store server lets be in
// their handshake (connected, not yet authenticated by their hello) at once:
// total in all, perHost from one remote host. The server closes a new
// connection over either bound at once, and a client turned away that way
// dials again after a pause; so a flood of idle or junk connections costs the
// server at most this many small handshakes, and clients on other hosts get
// through. Zero or less keeps the default: 256 in all, 64 per host. Raise
// perHost when more clients than that start at the same instant on one
// machine and their set-up time matters.
func WithMaxPending(total, perHost int) Option {
	return func(c *config) {
		c.maxPending, c.maxPendingPerHost = total, perHost
	}
}

// WithLogger sets where a TCP store server reports refused clients and
// dropped connections, and where clients report reconnects. The default is
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		c.logger = l
	}
}

// WithPollInterval sets the longest pause between two looks at the file of a
// file store while a Get or Wait waits for a key (polls start at 1 ms and back
// off up to this bound). Non-positive values are ignored.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.poll = d
		}
	}
}

// Observer is told of every operation a TCP store client completes: its
// name (set, get, add, compare_set, delete_key, num_keys, check, wait,
// multi_set, multi_get, append), how long it took, reconnects and retries
// included, and its error (nil on success). StoreOp is called on the
// goroutine that made the call, after the reply, so it must be quick and
// safe for concurrent use. Package metrics implements one (metrics.Store)
// that counts the operations and keeps histograms of their latencies.
type Observer interface {
	StoreOp(op string, d time.Duration, err error)
}

// WithObserver has a TCP store client report each of its operations to o.
// Without it (the default) nothing is measured. The memory and file stores
// ignore it.
func WithObserver(o Observer) Option {
	return func(c *config) {
		c.observer = o
	}
}
