package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/liveness"
)

// Grace periods for shutdown: how long Abort and Close wait for a busy writer
// before cutting its connection, and how long Close waits for a peer to answer
// its goodbye before closing the socket.
const (
	writerGrace = 500 * time.Millisecond
	closeGrace  = 2 * time.Second
	// recvGrace is how long a Recv whose context ended waits for a message
	// already streaming into its buffer before the connection is cut.
	recvGrace = 2 * time.Second
)

// Transport is a TCP transport.Transport: one connection to every other rank.
// Create it with Backend.Connect or Backend.ConnectTCP.
type Transport struct {
	rank, size int
	maxMsg     int64
	peers      []*peer // indexed by rank; peers[rank] delivers to itself

	live  liveness.Config // resolved; Timeout < 0 when the check is off
	epoch time.Time       // origin of the peers' monotonic time stamps

	down atomic.Pointer[error] // set once by Abort or Close

	msgs    msgPool
	reqs    sync.Pool // *recvReq
	queues  sync.Pool // *tagQueue
	ackChs  sync.Pool // chan error of capacity 1, for sends by reference
	readers sync.WaitGroup

	watchers sync.WaitGroup // one per connection (liveness.go)

	life      sync.Mutex // serialises Abort and Close
	closeOnce sync.Once
	drainOnce sync.Once     // drainAsync's
	drained   chan struct{} // closed when Abort's drain ends
}

var _ transport.Transport = (*Transport)(nil)

func newTransport(rank, size int, maxMsg int64, live liveness.Config) *Transport {
	t := &Transport{rank: rank, size: size, maxMsg: maxMsg, peers: make([]*peer, size), live: live.Resolve(), epoch: time.Now()}
	t.reqs.New = func() any { return &recvReq{done: make(chan error, 1)} }
	t.queues.New = func() any { return new(tagQueue) }
	t.ackChs.New = func() any { return make(chan error, 1) }
	for r := range t.peers {
		t.peers[r] = newPeer(t, r, nil, sameHost{})
	}
	return t
}

func (t *Transport) getAck() chan error  { return t.ackChs.Get().(chan error) }
func (t *Transport) putAck(c chan error) { t.ackChs.Put(c) }

// start attaches the connections (indexed by rank) and starts their
// readers and watchers; hosts says which peers exchange large messages by
// single copies.
func (t *Transport) start(conns []*net.TCPConn, hosts []sameHost) {
	for r, c := range conns {
		if c == nil {
			continue
		}
		p := newPeer(t, r, c, hosts[r])
		t.peers[r] = p
		t.readers.Add(1)
		go p.readLoop()
		t.watchers.Add(1)
		go p.watch()
	}
}

// PeerTimeout returns how long a peer may stay silent before it counts as
// unresponsive, or a negative duration when the check is off.
func (t *Transport) PeerTimeout() time.Duration { return t.live.Timeout }

// PeerError returns why the link to rank failed (an error wrapping
// ErrPeerLost, ErrClosed or the cause of an Abort), or nil while it
// stands. Layers above use it to explain a wait that ended for another
// reason, such as a deadline.
func (t *Transport) PeerError(rank int) error {
	if rank < 0 || rank >= t.size {
		return nil
	}
	return t.peers[rank].goneErr()
}

// Rank returns this process's rank.
func (t *Transport) Rank() int { return t.rank }

// Size returns the number of ranks in the world.
func (t *Transport) Size() int { return t.size }

// MaxMessage returns the largest message this transport sends or receives.
func (t *Transport) MaxMessage() int64 { return t.maxMsg }

func (t *Transport) downErr() error {
	if e := t.down.Load(); e != nil {
		return *e
	}
	return nil
}

func (t *Transport) peer(op string, r int) (*peer, error) {
	if r < 0 || r >= t.size {
		return nil, fmt.Errorf("tcp: %s: peer rank %d out of range for world size %d: %w", op, r, t.size, transport.ErrInvalidArgument)
	}
	return t.peers[r], nil
}

// ctxErr is the error of a send or receive (op "send" or "recv") with peer
// that gave up because ctx ended, under the context rule of internal/errs.
func (t *Transport) ctxErr(ctx context.Context, op string, peer int, tag transport.Tag) error {
	dir := "to"
	if op == "recv" {
		dir = "from"
	}
	return errs.FromContext(ctx, fmt.Sprintf("tcp: %s: rank %d %s rank %d (tag %#x)", op, t.rank, dir, peer, uint64(tag)))
}

// begin checks what Send and Recv (op "send" or "recv") check before they
// touch the connection, and returns peer's link.
func (t *Transport) begin(ctx context.Context, op string, peer int, tag transport.Tag, n int) (*peer, error) {
	if err := errs.CheckContext(ctx, "tcp", op); err != nil {
		return nil, err
	}
	p, err := t.peer(op, peer)
	if err != nil {
		return nil, err
	}
	if int64(n) > t.maxMsg {
		verb := "sending %d bytes to"
		if op == "recv" {
			verb = "receiving %d bytes from"
		}
		return nil, fmt.Errorf("tcp: %s: rank %d: "+verb+" rank %d: above the message limit of %d bytes (transport.Config.MaxMessage): %w",
			op, t.rank, n, peer, t.maxMsg, transport.ErrTooLarge)
	}
	if err := t.downErr(); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, t.ctxErr(ctx, op, peer, tag)
	}
	return p, nil
}

// Send delivers buf to peer under tag. The payload goes to the kernel with
// one writev call together with the frame header; buf may be reused as soon
// as Send returns.
func (t *Transport) Send(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	p, err := t.begin(ctx, "send", peer, tag, len(buf))
	if err != nil {
		return err
	}
	if p.conn == nil {
		return p.deliverLocal(tag, buf)
	}
	return p.send(ctx, tag, buf)
}

// Recv receives the next message from peer under tag into buf, which must have
// exactly the message's length. When the Recv is posted before the message
// arrives, the payload is read from the socket directly into buf.
func (t *Transport) Recv(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	p, err := t.begin(ctx, "recv", peer, tag, len(buf))
	if err != nil {
		return err
	}
	return p.recv(ctx, tag, buf)
}

// Abort fails every pending and future operation with an error wrapping
// cause, and sends an abort frame to every peer so that their operations with
// this rank fail with ErrPeerLost. It returns once the frames are sent; the
// wait for every peer's acknowledgement (it closes its side of the
// connection), bounded by a grace period of a few seconds, goes on in the
// background, since a stopped or unreachable peer never answers and the
// caller of a failed operation should not wait for it. Close must still be
// called; it waits for the acknowledgements, so that after Close no peer
// still believes this rank alive.
func (t *Transport) Abort(cause error) {
	if cause == nil {
		cause = errors.New("no cause given")
	}
	err := fmt.Errorf("tcp: rank %d aborted: %w", t.rank, cause)
	t.life.Lock()
	defer t.life.Unlock()
	if !t.down.CompareAndSwap(nil, &err) {
		return
	}
	for _, p := range t.peers {
		p.fail(err)
	}
	text := []byte(cause.Error())
	if len(text) > maxCauseLen {
		text = text[:maxCauseLen]
	}
	t.eachConn(func(p *peer) { p.shutdownWrite(frameAbort, text) })
	// A peer answers the abort frame by closing its side, which ends our
	// reader; Close waits for that (drainReaders), Abort does not.
	t.drainAsync()
}

// drainAsync starts drainReaders in the background (once).
func (t *Transport) drainAsync() {
	t.drainOnce.Do(func() {
		t.drained = make(chan struct{})
		go func() {
			defer close(t.drained)
			t.drainReaders()
		}()
	})
}

// drainReaders lets every reader run until its peer closes its side, for at
// most closeGrace, and waits for them.
func (t *Transport) drainReaders() {
	deadline := time.Now().Add(closeGrace)
	for _, p := range t.peers {
		if p.conn != nil {
			p.conn.SetReadDeadline(deadline)
		}
	}
	t.readers.Wait()
}

// Close says goodbye to every peer, waits briefly for them to answer, and
// releases every connection and goroutine. Pending operations fail with
// ErrClosed. Close is idempotent.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		err := fmt.Errorf("tcp: rank %d: transport closed: %w", t.rank, transport.ErrClosed)
		t.life.Lock()
		t.down.CompareAndSwap(nil, &err)
		for _, p := range t.peers {
			p.fail(err)
		}
		t.eachConn(func(p *peer) { p.shutdownWrite(frameBye, nil) })
		t.life.Unlock()
		// Let readers drain until each peer closes its side, then cut.
		t.drainAsync()
		<-t.drained
		t.watchers.Wait() // every peer has failed, so each ends promptly
		for _, p := range t.peers {
			if p.conn != nil {
				p.conn.Close()
			}
		}
	})
	return nil
}

// eachConn runs f on every remote peer concurrently and waits.
func (t *Transport) eachConn(f func(*peer)) {
	var wg sync.WaitGroup
	for _, p := range t.peers {
		if p.conn != nil {
			wg.Add(1)
			go func() { defer wg.Done(); f(p) }()
		}
	}
	wg.Wait()
}
