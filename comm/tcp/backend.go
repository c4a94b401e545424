package tcp

import (
	"context"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/liveness"
)

// DefaultMaxMessage bounds one message when transport.Config.MaxMessage is 0.
const DefaultMaxMessage int64 = 1 << 30

// DefaultSocketBuffer is the send and receive buffer size requested for every
// connection when no WithSocketBuffer option is given.
const DefaultSocketBuffer = 4 << 20

// DefaultPeerTimeout is how long a peer may send nothing, not even a
// heartbeat, before it counts as unresponsive, when neither WithPeerTimeout
// nor transport.Config.PeerTimeout says otherwise. Idle links carry a
// heartbeat every second.
const DefaultPeerTimeout = liveness.Timeout

// defaultConnectTimeout bounds connection set-up when neither the context nor
// transport.Config.Timeout sets a deadline.
const defaultConnectTimeout = 5 * time.Minute

// Backend builds TCP transports. The zero value is ready to use: it listens on
// every interface and advertises each of its addresses to its peers. Use
// NewBackend with options to change that.
type Backend struct {
	host           string
	sockBuf        int
	sockBufOK      bool
	noSameHostCopy bool
	peerTimeout    time.Duration // 0: DefaultPeerTimeout; negative: no check
}

// Option configures a Backend.
type Option func(*Backend)

// WithHost makes the backend listen on host (a name or IP address of this
// machine) and advertise only that address, for machines with several
// networks where only one reaches the other ranks.
func WithHost(host string) Option { return func(b *Backend) { b.host = host } }

// WithSocketBuffer sets the kernel send and receive buffer size of every
// connection in bytes; 0 leaves the kernel's automatic tuning in charge.
func WithSocketBuffer(bytes int) Option {
	return func(b *Backend) { b.sockBuf, b.sockBufOK = bytes, true }
}

// WithSameHostCopy turns single-copy transfers between ranks on one machine
// on (the default) or off (rpc.WithSameHostCopy is the same knob for RPC). When on, a large message to a rank that runs on
// this machine is not pushed through the socket: the receiver copies it
// straight out of the sender's memory (process_vm_readv on Linux), which
// halves the copying. Connection set-up finds out whether the kernel allows
// it for each pair of ranks; where it does not, messages use the socket.
func WithSameHostCopy(on bool) Option { return func(b *Backend) { b.noSameHostCopy = !on } }

// WithPeerTimeout sets how long a peer may stay silent (no data, no
// heartbeat) before this rank counts it as unresponsive: its pending and
// later operations then fail with an error wrapping ErrPeerLost that says
// since when it has been silent, and the kernel gives up on data the peer's
// machine leaves unacknowledged for as long (TCP_USER_TIMEOUT). Idle links
// carry a heartbeat every third of d (at most every second), so a live
// peer is never silent that long. d = 0 keeps DefaultPeerTimeout; d < 0
// turns the check off (heartbeats are still sent, for peers that check).
// A nonzero transport.Config.PeerTimeout overrides it for one Connect.
// Raise it on links that lose packets heavily or stall for seconds.
func WithPeerTimeout(d time.Duration) Option { return func(b *Backend) { b.peerTimeout = d } }

// NewBackend returns a Backend configured by opts.
func NewBackend(opts ...Option) Backend {
	var b Backend
	for _, o := range opts {
		o(&b)
	}
	return b
}

func (b Backend) sameHostCopy() bool { return !b.noSameHostCopy }

func (b Backend) socketBuffer() int {
	if b.sockBufOK {
		return b.sockBuf
	}
	return DefaultSocketBuffer
}

// Connect connects this rank to every other rank of the world described by
// cfg and returns the transport. It blocks until the full mesh is up, the
// context ends or cfg.Timeout passes (5 minutes when zero), and then fails
// with an error that names the ranks that never connected.
func (b Backend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	return transport.Upcast(b.connect(ctx, cfg))
}

// ConnectTCP is Connect returning the concrete type.
func (b Backend) ConnectTCP(ctx context.Context, cfg transport.Config) (*Transport, error) {
	return b.connect(ctx, cfg)
}

func (b Backend) connect(ctx context.Context, cfg transport.Config) (*Transport, error) {
	if err := errs.CheckContext(ctx, "tcp", "connect"); err != nil {
		return nil, err
	}
	if err := cfg.Validate("tcp", maxWorld); err != nil {
		return nil, err
	}
	maxMsg := cfg.MaxMessage
	if maxMsg == 0 {
		maxMsg = DefaultMaxMessage
	}
	live := liveness.Config{Timeout: b.peerTimeout}
	if cfg.PeerTimeout != 0 {
		live.Timeout = cfg.PeerTimeout
	}
	t := newTransport(cfg.Rank, cfg.Size, maxMsg, live)
	if cfg.Size == 1 {
		return t, nil
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conns, err := b.mesh(cctx, ctx, cfg, timeout)
	if err != nil {
		return nil, err
	}
	hosts, err := b.probeSameHost(cctx, cfg.Rank, conns)
	if err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	t.start(conns, hosts)
	return t, nil
}

// maxWorld bounds the world size that the handshake can carry comfortably.
const maxWorld = 1 << 20
