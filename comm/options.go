package comm

import (
	"log/slog"
	"time"

	"github.com/tandemml/tandem/launch"
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
	staging       bool   // all-reduces on one host go through a staging segment (stage.go)
	sharedDir     string // where staging segments and shared tensors are made

	loggerSet  bool              // WithLogger was given
	flightSize int               // operations each group remembers; 0: none
	flightDir  string            // "": from the environment (launch.Debug)
	debug      launch.DebugLevel // valid when debugSet
	debugSet   bool              // WithDebugLevel was given
}

func defaultOptions() options {
	return options{
		timeout:       DefaultTimeout,
		maxObjectSize: DefaultMaxObjectSize,
		logger:        slog.New(slog.DiscardHandler),
		ringThreshold: DefaultRingThreshold,
		chunkSize:     DefaultChunkSize,
		staging:       true,
		sharedDir:     DefaultSharedDir,
		flightSize:    DefaultFlightRecorderSize,
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
			o.logger, o.loggerSet = l, true
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

// WithStaging says whether all-reduces, broadcasts, all-gathers and
// reduce-scatters of ordinary tensors on a group whose ranks all run on
// this host (the shm backend, in-process ranks) go through a staging
// segment in /dev/shm (WithSharedDir) that the ranks read from each other
// directly (true, the default), or through the transport's buffers (false).
// The segment is mapped on the group's first such collective: three
// buffers of at least 2 MiB a rank, of 32 MiB where the ranks outnumber
// the CPUs and /dev/shm has room for them. Where it
// cannot be mapped (a /dev/shm too small, as in a container's default
// 64 MiB with many ranks), all-reduces go through the transport and the
// group's logger says why. Subgroups inherit
// the world group's setting unless given their own.
func WithStaging(on bool) Option { return func(o *options) { o.staging = on } }

// DefaultSharedDir is where a group makes its staging segment and its
// shared tensors unless WithSharedDir says otherwise.
const DefaultSharedDir = "/dev/shm"

// WithSharedDir sets the directory in which the group makes its staging
// segment and its shared tensors (NewSharedTensor, ddp.SharedBuckets):
// DefaultSharedDir unless given. It should be a tmpfs, or the ranks' reads
// of each other's memory go to disk; every rank of the group must name the
// same directory. A container that keeps /dev/shm at 64 MiB can mount a
// larger tmpfs elsewhere and name it here. Where the directory is missing
// or full, staging is off and shared tensors are unavailable
// (ErrSharedUnavailable) on every rank alike. "" keeps the default.
// Subgroups inherit the world group's directory unless given their own.
func WithSharedDir(dir string) Option {
	return func(o *options) {
		if dir != "" {
			o.sharedDir = dir
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

// WithFlightRecorder sets how many of its last operations each process
// group remembers for its flight record (DefaultFlightRecorderSize); n = 0
// turns the recorder off, n < 0 keeps the default. The world group's value
// is every subgroup's default.
func WithFlightRecorder(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.flightSize = n
		}
	}
}

// WithFlightDir sets the directory that flight records are dumped to
// (default: $TANDEM_FLIGHT_DIR, else os.TempDir()/tandem-flight-RUNID; see
// launch.Debug). Each rank writes its own file there, named by
// FlightFileName. It takes effect on the world group.
func WithFlightDir(dir string) Option { return func(o *options) { o.flightDir = dir } }

// WithDebugLevel sets the debug level, overriding TANDEM_DEBUG and
// TORCH_DISTRIBUTED_DEBUG: at launch.DebugInfo the group logs its creation
// (and DDP its bucket layout), and the process dumps its flight record on
// SIGUSR1; at launch.DebugDetail every collective is logged as well and the
// flight recorder keeps the stack that issued it. Without WithLogger, the
// logs go to slog.Default() at these levels.
func WithDebugLevel(l launch.DebugLevel) Option {
	return func(o *options) { o.debug, o.debugSet = l, true }
}
