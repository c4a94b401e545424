package rpc

import (
	"crypto/tls"
	"log/slog"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/liveness"
	"github.com/tandemml/tandem/launch"
)

// Defaults.
const (
	// DefaultTimeout bounds a call whose context has no earlier deadline and
	// that sets no WithTimeout, and the agent's rendezvous when its context
	// has no deadline. Graceful shutdown is not bounded by it: see Shutdown.
	DefaultTimeout = 60 * time.Second
	// DefaultLivenessTimeout is how long a connection may go without a byte
	// from its worker before the worker counts as unresponsive (see
	// WithLivenessTimeout).
	DefaultLivenessTimeout = liveness.Timeout
	// DefaultMaxMessageSize bounds one frame (head and tensor data).
	DefaultMaxMessageSize = 1 << 30
	// TokenEnv names the variable that supplies the shared token when
	// WithToken is not given: launch.TokenEnv.
	TokenEnv = launch.TokenEnv
)

// Option configures an agent (Init, InitFromEnv).
type Option func(*options)

type options struct {
	store          store.Store
	storePrefix    string
	registry       *Registry
	listenAddr     string
	advertiseHost  string
	token          string
	tokenSet       bool
	tls            *tls.Config
	timeout        time.Duration
	maxMessage     int64
	logger         *slog.Logger
	debug          launch.DebugLevel // valid when debugSet
	debugSet       bool
	clientIC       []ClientInterceptor
	serverIC       []ServerInterceptor
	socketBuffer   int
	handshakeLimit time.Duration
	sameHostCopy   bool
	push           bool
	poll           time.Duration
	live           liveness.Config
	extensions     []Extension
	job            *launch.Job // the job InitFromEnv read; nil: read the environment
}

func newOptions(opts []Option) options {
	o := options{
		storePrefix:    "rpc/",
		timeout:        DefaultTimeout,
		maxMessage:     DefaultMaxMessageSize,
		socketBuffer:   4 << 20,
		handshakeLimit: admit.HandshakeTimeout,
		sameHostCopy:   true,
		push:           true,
		poll:           DefaultPoll,
	}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	o.live = o.live.Resolve()
	if o.registry == nil {
		o.registry = NewRegistry()
	}
	return o
}

// withJob hands Init the job InitFromEnv read, so that the environment is
// read once.
func withJob(j launch.Job) Option { return func(o *options) { o.job = &j } }

// WithStore makes the agent rendezvous through s (shared with a process
// group, say) instead of a TCP store built from MASTER_ADDR and MASTER_PORT.
// The agent does not close a store it was given.
func WithStore(s store.Store) Option { return func(o *options) { o.store = s } }

// WithStorePrefix sets the prefix of the agent's keys in the store (default
// "rpc/"); two agent groups sharing one store need different prefixes.
func WithStorePrefix(p string) Option { return func(o *options) { o.storePrefix = p } }

// WithRegistry serves the functions of r (shared, not copied). Without it the
// agent starts with an empty registry of its own.
func WithRegistry(r *Registry) Option { return func(o *options) { o.registry = r } }

// WithListenAddr sets where the agent listens (host:port; port 0 picks one).
// The default is port 0 on the address this host uses to reach MASTER_ADDR
// (127.0.0.1 when MASTER_ADDR is unset or a loopback address).
func WithListenAddr(addr string) Option { return func(o *options) { o.listenAddr = addr } }

// WithAdvertiseHost sets the host that other workers dial, when it differs
// from the listening host (a NAT, a listening address of 0.0.0.0).
func WithAdvertiseHost(host string) Option { return func(o *options) { o.advertiseHost = host } }

// WithToken sets the shared secret that both ends of every connection prove
// they know, by a challenge-response that never sends it. Without it the
// agent uses TANDEM_TOKEN, and if that is unset too, the workers agree on a
// random token through the store (the first to ask creates it), so that only
// processes that can reach the store can connect.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithTLS runs every connection over TLS with cfg, on both sides: as server
// cfg needs Certificates (and, for mutual TLS, ClientAuth
// tls.RequireAndVerifyClientCert with ClientCAs); as client it needs RootCAs
// (and Certificates for mutual TLS). When cfg.ServerName is empty the client
// side verifies the peer's host as dialled. The token is checked as well.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithDefaultTimeout sets the agent's default call timeout (DefaultTimeout
// unless set). Non-positive values are ignored.
func WithDefaultTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithLivenessTimeout sets how long a connection may go without a byte from
// its worker before the worker counts as unresponsive (DefaultLivenessTimeout,
// 5 s, when d is 0). Every connection proves its peer alive: each side sends
// a heartbeat frame whenever it has written nothing for a third of d (at
// most every second), and any bytes received count as life. A worker silent
// for d (stopped, frozen, swapped out, or behind a cut link) has its
// connections failed: the calls waiting on it fail with ErrPeerLost and a
// message saying it is unresponsive and since when, and its handlers here
// see their context cancelled. The same d is set as TCP_USER_TIMEOUT (Linux),
// so that a write left unacknowledged for d fails too, and it bounds
// connecting to a worker (handshake included) to 2×d. A negative d turns the
// check off (heartbeats are still sent). Give every worker of a group the
// same setting: a worker with a shorter d than a peer's heartbeat interval
// would take that peer for dead.
func WithLivenessTimeout(d time.Duration) Option {
	return func(o *options) { o.live = liveness.Config{Timeout: d} }
}

// WithMaxMessageSize bounds the size of one frame (argument or result with
// its tensors). A larger frame received closes the connection that carried
// it; a larger one sent fails the call with ErrTooLarge.
func WithMaxMessageSize(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.maxMessage = n
		}
	}
}

// WithLogger sets where the agent logs connection failures and leaks
// (slog.Default otherwise), and what the debug level asks for.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithDebugLevel sets the agent's debug level, overriding TANDEM_DEBUG (and
// TORCH_DISTRIBUTED_DEBUG): at launch.DebugInfo the agent logs the
// rendezvous (who met, how long it took), at launch.DebugDetail also every
// call it makes (callee, function, duration, error) and every request it
// serves, with slog at level Info on its logger.
func WithDebugLevel(l launch.DebugLevel) Option {
	return func(o *options) { o.debug, o.debugSet = l, true }
}

// WithClientInterceptor adds an interceptor around every outgoing call (the
// first added is the outermost).
func WithClientInterceptor(ic ClientInterceptor) Option {
	return func(o *options) { o.clientIC = append(o.clientIC, ic) }
}

// WithServerInterceptor adds an interceptor around every incoming call (the
// first added is the outermost).
func WithServerInterceptor(ic ServerInterceptor) Option {
	return func(o *options) { o.serverIC = append(o.serverIC, ic) }
}

// WithSocketBuffer sets the kernel send and receive buffer of each
// connection in bytes (default 4 MiB; 0 keeps the system's).
func WithSocketBuffer(n int) Option { return func(o *options) { o.socketBuffer = n } }

// WithSameHostCopy turns same-host copies on (the default) or off: between
// workers on one machine, large tensors are copied straight from the
// sender's memory (Linux process_vm_readv) instead of through the socket,
// where the handshake finds that this works (see the package docs).
func WithSameHostCopy(on bool) Option { return func(o *options) { o.sameHostCopy = on } }

// WithPush turns pushed tensors on (the default) or off. On a connection
// with same-host copies both ways, the receiver of a tensor of 1 MiB or
// more grants the sender memory for the next one, and the sender, which
// would otherwise wait, writes part of that tensor into it itself
// (process_vm_writev) while the receiver copies the rest: the copy runs on
// two cores. Off, the receiver copies every tensor alone. Both ends must
// agree: a connection pushes when both agents have it on.
func WithPush(on bool) Option { return func(o *options) { o.push = on } }

// WithPoll sets how long a read loop on a connection to a worker of the
// same host looks for the next frame, yielding to the process's other
// goroutines between looks, before it parks on the network poller (default
// DefaultPoll; 0 parks at once). Waking a parked reader costs tens of
// microseconds on virtual machines, more than a small call's whole round
// trip otherwise; set 0 where workers share their cores with other busy
// processes. The poll grows with the connection's waits: after a wait for
// a frame of up to 2 ms it lasts twice that wait (the reply to a call of a
// few megabytes) and shrinks slowly over the shorter waits that follow,
// and after a longer one it is back to d. Connections
// between hosts and over TLS always park at once.
func WithPoll(d time.Duration) Option { return func(o *options) { o.poll = max(d, 0) } }

// CallOption configures one call.
type CallOption func(*callOptions)

type callOptions struct {
	timeout time.Duration
	meta    Metadata
	into    []*tensor.Dense
}

// WithTimeout bounds the call: past d it fails with ErrTimeout (and the
// callee's handler sees its context cancelled). Non-positive d means the
// agent's default.
func WithTimeout(d time.Duration) CallOption {
	return func(c *callOptions) { c.timeout = d }
}

// WithResultInto lends memory for the result's tensors, the way append
// reuses a slice's array: the i-th tensor of the reply is received into
// ts[i] when its dtype and shape match (and ts[i] owns its data whole, not a
// view, and is not lent twice), and the decoded result then holds ts[i]
// itself; a tensor that does not match gets new memory as usual. Use it in loops that call again and
// again for results of one shape, and assign the result:
//
//	y, err = rpc.Sync[*tensor.Dense](ctx, a, "w1", "step", x, rpc.WithResultInto(y))
//
// The same memory, reused, stays in the CPU's caches and leaves nothing for
// the garbage collector, where new memory for every reply costs a cold copy.
// Today the lent memory is used for replies copied from a worker on the same
// host (see WithSameHostCopy); replies that come over the network arrive in
// new memory. The tensors must not be read or written until the call has
// ended (Sync returned, or the future completed), and if the call fails
// their contents are unspecified.
func WithResultInto(ts ...*tensor.Dense) CallOption {
	return func(c *callOptions) { c.into = ts }
}

// WithMetadata sends key/value pairs with the call; the callee reads them
// with MetadataFromContext.
func WithMetadata(md Metadata) CallOption {
	return func(c *callOptions) {
		if c.meta == nil {
			c.meta = Metadata{}
		}
		for k, v := range md {
			c.meta[k] = v
		}
	}
}
