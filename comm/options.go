package comm

import (
	"log/slog"
	"time"
)

// DefaultTimeout bounds an operation whose context carries no deadline, unless
// WithTimeout sets another default.
const DefaultTimeout = 5 * time.Minute

// DefaultMaxObjectSize bounds the encoded size of one value in the object
// collectives (BroadcastObject, AllGatherObject, GatherObject, ScatterObject).
const DefaultMaxObjectSize = 256 << 20

// Tuning defaults for the collective algorithms.
const (
	// DefaultRingThreshold: all-reduces of at least this many bytes use the
	// ring algorithm (bandwidth-optimal); smaller ones use recursive doubling
	// (latency-optimal).
	DefaultRingThreshold = 64 << 10
	// DefaultChunkSize: ring and tree algorithms cut a buffer into chunks of
	// at most this many bytes and pipeline them. Between ranks on one
	// machine a chunk moves in one copy from the sender's memory (see
	// comm/tcp's single-copy transfers), whose fixed cost per message is
	// what the size amortises; 2 MiB chunks also still pipeline a ring
	// step of a few megabytes.
	DefaultChunkSize = 2 << 20
)

// Option configures a process group.
type Option func(*options)

type options struct {
	timeout       time.Duration
	name          string
	maxObjectSize int64
	logger        *slog.Logger
	ringThreshold int
	chunkSize     int
}

func defaultOptions() options {
	return options{
		timeout:       DefaultTimeout,
		maxObjectSize: DefaultMaxObjectSize,
		logger:        slog.New(slog.DiscardHandler),
		ringThreshold: DefaultRingThreshold,
		chunkSize:     DefaultChunkSize,
	}
}

// WithTimeout sets the default time limit of an operation whose context has no
// deadline (DefaultTimeout when not given). d <= 0 keeps the default. A peer
// that freezes or drops off the network fails the operation much sooner,
// after the backend's peer timeout (5 s for the built-in TCP backend; see
// WithPeerTimeout), so this limit need not be short to catch those.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithName names the group in errors and logs ("world" for a world group,
// "group<id>" for subgroups when not given).
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithMaxObjectSize bounds the gob-encoded size in bytes of one value in the
// object collectives; larger values fail with ErrTooLarge on every rank.
// n <= 0 keeps DefaultMaxObjectSize.
func WithMaxObjectSize(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.maxObjectSize = n
		}
	}
}

// WithLogger sets the logger that reports aborts and failures (silent by
// default).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithRingThreshold sets the size in bytes from which all-reduce uses the ring
// algorithm instead of recursive doubling (DefaultRingThreshold). n = 0 always
// uses the ring; n < 0 keeps the default.
func WithRingThreshold(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.ringThreshold = n
		}
	}
}

// WithChunkSize sets the size in bytes of the pieces that pipelined algorithms
// send (DefaultChunkSize). It is rounded down to whole elements, and to at
// least one element. n <= 0 keeps the default.
func WithChunkSize(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.chunkSize = n
		}
	}
}
