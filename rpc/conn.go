package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/liveness"
	"github.com/tandemml/tandem/internal/wire"
)

// conn is one TCP (or TLS) connection. A client conn carries this agent's
// calls to one worker; a server conn carries one worker's calls to us.
type conn struct {
	a      *Agent
	nc     net.Conn
	peer   WorkerInfo
	client bool
	br     *bufio.Reader
	rd     io.Reader // br, noting when bytes arrive for the liveness check

	// liveness (watch): when a read last returned bytes and when a write
	// last completed (unix ns).
	readAt    atomic.Int64
	wroteAt   atomic.Int64
	watchOnce sync.Once

	// writing: one goroutine flushes at a time; frames queued meanwhile go
	// out together in its next writev, and their senders wait for that.
	wmu      sync.Mutex
	wcond    sync.Cond
	queue    net.Buffers
	spare    net.Buffers
	flushing bool
	gen      uint64 // batches taken
	doneGen  uint64 // batches written
	werr     error

	// client side: calls awaiting their reply.
	pmu     sync.Mutex
	pending map[uint64]*pendingCall
	nextID  uint64
	dead    atomic.Bool
	deadErr error

	// server side: handlers running, by call id, to cancel them.
	rmu     sync.Mutex
	running map[uint64]*callCtx

	names     map[string]string // function and type names seen, interned
	wdeadline time.Time         // the write deadline last set (flusher only)

	// same-host copies (cma.go): whether the peer copies our tensors out of
	// our memory, whether we copy theirs, and the acknowledgements awaited.
	peerPID   int
	sendByRef bool
	recvByRef bool
	fetch     func(dst []byte, addr uint64) error
	into      func(id uint64) ([]*tensor.Dense, func()) // client side: c.lent
	amu       sync.Mutex
	acks      map[uint64]chan struct{}
	acksSeen  atomic.Int64  // read-done frames received
	done      chan struct{} // closed by close
	// dispatching is set while the read loop runs a frame's handling, which
	// may run callbacks and async handlers: a by-reference send waits for an
	// acknowledgement that only the read loop can deliver, so sends made
	// meanwhile go inline.
	dispatching atomic.Int32
	// pushed tensors (push.go): whether this connection pushes (both ends
	// copy each other's memory, and pushing is on), the memory granted to
	// the peer, and the memory the peer granted.
	pushOK bool
	land   landings
	grant  grants
	// poll reads the socket under br, polling before it parks (poll.go);
	// nil where the connection has no descriptor to poll (TLS).
	poll *pollReader

	closeOnce sync.Once
}

func newConn(a *Agent, nc net.Conn, peer WorkerInfo, client bool, br *bufio.Reader, peerPID int, sendByRef, recvByRef, push bool) *conn {
	c := &conn{a: a, nc: nc, peer: peer, client: client, br: br, peerPID: peerPID, sendByRef: sendByRef, recvByRef: recvByRef,
		acks: map[uint64]chan struct{}{}, done: make(chan struct{})}
	c.rd = &lifeReader{r: br, at: &c.readAt}
	now := time.Now().UnixNano()
	c.readAt.Store(now)
	c.wroteAt.Store(now)
	if lc := a.opts.live; lc.Timeout > 0 {
		// A write left unacknowledged for the liveness timeout fails, where
		// TCP would retransmit for many minutes.
		raw := nc
		if tc, ok := nc.(*tls.Conn); ok {
			raw = tc.NetConn()
		}
		liveness.SetUserTimeout(raw, lc.Timeout)
	}
	c.fetch = c.fetcher()
	c.pushOK = sendByRef && recvByRef && push
	if client {
		c.into = c.lent
	}
	c.wcond.L = &c.wmu
	if client {
		c.pending = map[uint64]*pendingCall{}
	} else {
		c.running = map[uint64]*callCtx{}
	}
	return c
}

// write sends one frame's buffers and returns once they are written (so the
// caller may reuse or change them) or the connection failed.
func (c *conn) write(bufs net.Buffers) error {
	c.wmu.Lock()
	if c.werr != nil {
		err := c.werr
		c.wmu.Unlock()
		return err
	}
	c.queue = append(c.queue, bufs...)
	if c.flushing {
		mine := c.gen + 1
		for c.doneGen < mine && c.werr == nil {
			c.wcond.Wait()
		}
		err := c.werr
		if c.doneGen >= mine {
			err = nil
		}
		c.wmu.Unlock()
		return err
	}
	c.flushing = true
	return c.flushLocked()
}

// flushLocked writes the queue until it is empty; it is called with wmu
// held and flushing set, and returns with wmu released.
func (c *conn) flushLocked() error {
	for len(c.queue) > 0 && c.werr == nil {
		batch := c.queue
		c.queue = c.spare[:0]
		c.gen++
		g := c.gen
		c.wmu.Unlock()
		// A peer that stops reading must not block writers forever; the
		// deadline is refreshed when half of it is used, not per write.
		if now := time.Now(); c.wdeadline.Sub(now) < c.a.opts.timeout/2 {
			c.wdeadline = now.Add(c.a.opts.timeout)
			c.nc.SetWriteDeadline(c.wdeadline)
		}
		toWrite := batch
		_, err := toWrite.WriteTo(c.nc)
		c.wmu.Lock()
		clear(batch)
		c.spare = batch[:0]
		if err != nil {
			c.werr = err
			break
		}
		c.wroteAt.Store(time.Now().UnixNano())
		c.doneGen = g
		c.wcond.Broadcast()
	}
	c.flushing = false
	err := c.werr
	c.wcond.Broadcast()
	c.wmu.Unlock()
	if err != nil {
		c.close(fmt.Errorf("writing to worker %s: %w", c.peer, err))
	}
	return err
}

// post queues a small frame without waiting for it to be written (a
// goroutine flushes it if no writer is at work), so that the read loop
// never blocks on a peer that is itself blocked writing to us.
func (c *conn) post(buf []byte) {
	c.wmu.Lock()
	if c.werr != nil {
		c.wmu.Unlock()
		return
	}
	c.queue = append(c.queue, buf)
	if c.flushing {
		c.wmu.Unlock()
		return
	}
	c.flushing = true
	c.wmu.Unlock()
	go func() {
		c.wmu.Lock()
		c.flushLocked()
	}()
}

// close shuts the connection and fails every call waiting on it.
func (c *conn) close(reason error) {
	c.closeOnce.Do(func() {
		c.nc.Close()
		close(c.done)
		c.closeGrants()
		c.closeLandings()
		c.wmu.Lock()
		if c.werr == nil {
			c.werr = net.ErrClosed
		}
		c.wcond.Broadcast()
		c.wmu.Unlock()
		if c.client {
			c.pmu.Lock()
			c.dead.Store(true)
			c.deadErr = reason
			calls := c.pending
			c.pending = map[uint64]*pendingCall{}
			c.pmu.Unlock()
			for _, p := range calls {
				p.finish(nil, c.lostError(p, reason))
			}
		} else {
			c.rmu.Lock()
			for _, cc := range c.running {
				cc.cancel(context.Canceled)
			}
			c.rmu.Unlock()
			c.a.mu.Lock()
			delete(c.a.servers, c)
			c.a.mu.Unlock()
		}
	})
}

func (c *conn) lostError(p *pendingCall, reason error) error {
	if errors.Is(reason, errAgentClosed) {
		return fmt.Errorf("this agent shut down: %w", ErrClosed)
	}
	var ue *unresponsiveError
	if errors.As(reason, &ue) {
		return fmt.Errorf("the worker is %v: %w", reason, ErrPeerLost)
	}
	return fmt.Errorf("the connection to worker %s was lost: %v: %w", c.peer, reason, ErrPeerLost)
}

// peerGone describes why a read loop ended.
func peerGone(err error) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the worker closed the connection (it exited or shut down)")
	case errors.Is(err, net.ErrClosed):
		return errAgentClosed
	}
	return err
}

// readLoop reads frames until the connection fails, in the agent's
// lifetime (a.life). On a server connection, a call to a sync function
// hands the reading to a new loop and returns the function's work, which
// runs next on this goroutine outside the lifetime's count. The first read
// loop of a connection starts its liveness watch.
func (c *conn) readLoop(context.Context) (handler func()) {
	c.watchOnce.Do(func() { c.a.life.goFunc(c.watch) })
	return c.readFrames()
}

func (c *conn) readFrames() (handler func()) {
	hdr := make([]byte, wire.HeaderLen)
	for {
		f, err := wire.ReadFrame(c.rd, hdr, c.a.opts.maxMessage, c.intern, c.fetch, c.into, c.landingsFor())
		if err != nil {
			var pe *wire.ProtocolError
			if errors.As(err, &pe) {
				c.a.m.malformed.Add(1)
				c.a.opts.logger.Warn("rpc: closing a connection that sent a bad frame", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
			}
			c.close(peerGone(err))
			return nil
		}
		if f.Flags&(wire.FlagByRef|wire.FlagNoAck) == wire.FlagByRef {
			// The tensors are copied: the sender may go on.
			c.post(control(wire.KindReadDone, f.ID))
		}
		if f.Flags&wire.FlagByRef != 0 && c.pushOK {
			c.afterByRef(f)
		}
		switch f.Kind {
		case wire.KindReadDone:
			c.ackArrived(f.ID)
			continue
		case wire.KindHeartbeat:
			continue // its bytes were the point
		case wire.KindGrant:
			c.onGrant(f)
			continue
		case wire.KindRevoke:
			c.onRevoke(f.ID)
			continue
		case wire.KindRevoked:
			c.onRevoked(f.ID)
			continue
		}
		if c.client {
			c.dispatching.Add(1)
			c.a.onReply(c, f)
			c.dispatching.Add(-1)
			continue
		}
		c.dispatching.Add(1)
		h := c.a.onRequest(c, f)
		c.dispatching.Add(-1)
		if h != nil {
			if !c.a.life.goThen(c.readLoop) {
				// The agent is closing: the handler still runs, and sees
				// its context cancelled.
				c.close(errAgentClosed)
			}
			return h
		}
	}
}

// lifeReader notes when a read last returned bytes: the liveness watch
// takes any progress as a sign of life, a long frame still arriving
// included, not only whole frames.
type lifeReader struct {
	r  io.Reader
	at *atomic.Int64
}

func (r *lifeReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.at.Store(time.Now().UnixNano())
	}
	return n, err
}

// unresponsiveError is why a connection to a silent worker was failed.
type unresponsiveError struct{ msg string }

func (e *unresponsiveError) Error() string { return e.msg }

// watch keeps the connection's liveness until it closes, in the agent's
// lifetime: twice an interval it sends a heartbeat if nothing was written for
// most of an interval, and fails the connection when nothing has arrived
// for the timeout. Time the read loop spends dispatching a frame (running
// callbacks or an async handler) counts as life: bytes may be waiting
// unread. A tick that comes more than two intervals after the one before
// means this process itself did not run (stopped, starved), and the silence
// is not the peer's: the count starts again.
func (c *conn) watch(context.Context) {
	lc := c.a.opts.live
	t := time.NewTicker(lc.Interval / 2) // a silent peer is noticed within timeout + interval/2
	defer t.Stop()
	// excused: a time from which silence counts, later than the last read
	// when this process was not running or the read loop was busy.
	var excused time.Time
	prev := time.Now()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		now := time.Now()
		if now.Sub(prev) > 2*lc.Interval || c.dispatching.Load() > 0 {
			excused = now
		}
		prev = now
		if now.Sub(time.Unix(0, c.wroteAt.Load())) >= lc.Interval*3/4 {
			c.heartbeat()
		}
		heard := time.Unix(0, c.readAt.Load())
		if heard.Before(excused) {
			heard = excused
		}
		if lc.Timeout > 0 && now.Sub(heard) >= lc.Timeout {
			err := &unresponsiveError{liveness.Unresponsive(heard)}
			c.a.opts.logger.Warn("rpc: closing the connection to an unresponsive worker", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
			c.close(err)
			return
		}
	}
}

// heartbeat queues a heartbeat frame unless a write is in progress (which
// carries bytes anyway, or is stuck behind a peer that does not read, where
// one more frame would not help).
func (c *conn) heartbeat() {
	c.wmu.Lock()
	busy := c.flushing || c.werr != nil
	c.wmu.Unlock()
	if busy {
		return
	}
	c.post(control(wire.KindHeartbeat, 0))
}

// intern returns b as a string, reusing the strings of names seen before
// (function and type names repeat on every call).
func (c *conn) intern(b []byte) string {
	if s, ok := c.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if c.names == nil || len(c.names) >= 1024 {
		c.names = make(map[string]string)
	}
	c.names[s] = s
	return s
}

// control returns a frame of kind with id and nothing else (cancel,
// read-done, heartbeat, revoke, revoked).
func control(kind byte, id uint64) []byte {
	head, _, _ := wire.AppendHead(make([]byte, 0, wire.HeaderLen+8), &wire.Frame{Kind: kind, ID: id})
	return head
}
