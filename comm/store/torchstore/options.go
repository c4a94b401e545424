package torchstore

import (
	"log/slog"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// Defaults of the client and the server.
const (
	// DefaultKeyPrefix is what torch 1.13's TCPStore puts before every key
	// its Python and C++ API are given ("a" travels as "/a"). A client with
	// this prefix shares keys with PyTorch code.
	DefaultKeyPrefix = "/"
	// InitKey is the counter that torch 1.13's clients constructed with a
	// world size (and wait_for_workers, the default) add 1 to, without the
	// key prefix, and that a master constructed the same way waits on until
	// it reaches the world size.
	InitKey = "init/"
	// DefaultMaxConns bounds the connections a server keeps open at once.
	// Every torch 1.13 client opens two (the second stays silent, for key
	// watches), so this serves 1024 PyTorch clients.
	DefaultMaxConns = 2048
	// DefaultMaxConnsPerHost bounds the open connections from one remote
	// host: 256 PyTorch clients on one machine.
	DefaultMaxConnsPerHost = 512
	// DefaultQueryTimeout is how long a server waits for the rest of a
	// query once its first byte has arrived, and for a client to take a
	// reply.
	DefaultQueryTimeout = 30 * time.Second
	// idlePool is how many idle connections a client keeps for reuse.
	idlePool = 4
)

// Option configures a Client or a Server. Options that do not apply to one
// of them are ignored by it.
type Option func(*config)

type config struct {
	timeout        time.Duration
	logger         *slog.Logger
	maxValue       int
	maxConns       int
	maxPerHost     int
	queryTimeout   time.Duration
	prefix         string
	countIn        bool
	unauthenticate bool
}

func newConfig(opts []Option) config {
	c := config{
		timeout:      store.DefaultTimeout,
		maxValue:     store.DefaultMaxValue,
		maxConns:     DefaultMaxConns,
		maxPerHost:   DefaultMaxConnsPerHost,
		queryTimeout: DefaultQueryTimeout,
		prefix:       DefaultKeyPrefix,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

// WithTimeout sets a client's bound on every call whose context carries no
// earlier deadline (and the default timeout of Wait), including how long
// Dial keeps trying to reach a server that is not up yet. Default
// store.DefaultTimeout. Non-positive values are ignored.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithLogger sets where a server reports refused and dropped connections and
// where a client reports what it could not diagnose. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithMaxValue bounds one key or value (and the keys of one Check or Wait
// together) that a server accepts or a client reads back. A server closes a
// connection that announces more; a client refuses to send more, with an
// error wrapping store.ErrTooLarge. Default store.DefaultMaxValue (64 MiB).
// Non-positive values are ignored.
func WithMaxValue(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxValue = n
		}
	}
}

// WithMaxConns bounds how many connections a server keeps open at once, in
// all and from one remote host; connections over either bound are closed at
// once (and logged, at most once per admit.WarnEvery). Zero or less keeps the
// default (DefaultMaxConns, DefaultMaxConnsPerHost).
func WithMaxConns(total, perHost int) Option {
	return func(c *config) {
		if total > 0 {
			c.maxConns = total
		}
		if perHost > 0 {
			c.maxPerHost = perHost
		}
	}
}

// WithQueryTimeout sets how long a server waits for the rest of a query once
// its first byte has arrived, and for a client to take its replies, before it
// closes the connection. A connection that sends nothing at all is left open
// (torch 1.13 clients keep a silent second connection for key watches).
// Default DefaultQueryTimeout. Non-positive values are ignored.
func WithQueryTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.queryTimeout = d
		}
	}
}

// WithKeyPrefix sets what a client puts before every key on the wire.
// Default DefaultKeyPrefix ("/"), as torch 1.13's TCPStore does; the empty
// prefix reaches raw keys such as InitKey.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// CountIn makes Dial add 1 to InitKey, as a torch 1.13 TCPStore client built
// with a world size and wait_for_workers=True does, so that a PyTorch master
// waiting for its workers (torch.distributed.TCPStore(host, port, world_size,
// True)) counts this client among them.
func CountIn() Option {
	return func(c *config) { c.countIn = true }
}

// Unauthenticated acknowledges that the server it is given to lets anyone
// who can reach its address read, write and delete every key: PyTorch's
// TCPStore protocol carries no token. NewServer refuses to start without it.
func Unauthenticated() Option {
	return func(c *config) { c.unauthenticate = true }
}
