package rpc

import (
	"bufio"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"gorgonia.org/tensor"
)

// The connection handshake. The dialler sends
//
//	"TNDMRPC" version(1 byte) caller id (u32) token length (u16) token
//	same-host offer (45 bytes: see cma.go)
//
// and the acceptor answers one status byte (0 accepted, 1 wrong token, 2 bad
// hello), a u16 length and a message; when accepted, its own same-host offer
// and one byte saying whether it could read the dialler's probe. The dialler
// ends with one byte saying whether it could read the acceptor's. After
// that the dialler sends requests and the acceptor sends replies, as frames
// (see frame.go).
const (
	helloMagic   = "TNDMRPC"
	helloVersion = 1

	statusOK       = 0
	statusBadToken = 1
	statusBadHello = 2
)

// conn is one TCP (or TLS) connection. A client conn carries this agent's
// calls to one worker; a server conn carries one worker's calls to us.
type conn struct {
	a      *Agent
	nc     net.Conn
	peer   WorkerInfo
	client bool
	br     *bufio.Reader

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
	amu       sync.Mutex
	acks      map[uint64]chan struct{}
	done      chan struct{} // closed by close
	// dispatching is set while the read loop runs a frame's handling, which
	// may run callbacks and async handlers: a by-reference send waits for an
	// acknowledgement that only the read loop can deliver, so sends made
	// meanwhile go inline.
	dispatching atomic.Int32

	closeOnce sync.Once
}

func newConn(a *Agent, nc net.Conn, peer WorkerInfo, client bool, br *bufio.Reader, peerPID int, sendByRef, recvByRef bool) *conn {
	c := &conn{a: a, nc: nc, peer: peer, client: client, br: br, peerPID: peerPID, sendByRef: sendByRef, recvByRef: recvByRef,
		acks: map[uint64]chan struct{}{}, done: make(chan struct{})}
	c.fetch = c.fetcher()
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
		return fmt.Errorf("%w: rpc: call %q to worker %s: this agent shut down", ErrClosed, p.fn, c.peer)
	}
	return fmt.Errorf("%w: rpc: call %q to worker %s: connection lost: %v", ErrPeerLost, p.fn, c.peer, reason)
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

func (a *Agent) tuneSocket(nc net.Conn) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	tc.SetKeepAlive(true)
	tc.SetKeepAlivePeriod(15 * time.Second)
	if n := a.opts.socketBuffer; n > 0 {
		tc.SetReadBuffer(n)
		tc.SetWriteBuffer(n)
	}
}

// connTo returns the connection to worker id, dialling it if needed within
// timeout.
func (a *Agent) connTo(ctx context.Context, id int, timeout time.Duration) (*conn, error) {
	s := a.peers[id]
	if c := s.cur.Load(); c != nil && !c.dead.Load() {
		return c, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case s.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctxError(ctx, fmt.Sprintf("rpc: waiting to connect to worker %s", a.workers[id]))
	}
	defer func() { <-s.dialing }()
	if c := s.cur.Load(); c != nil && !c.dead.Load() {
		return c, nil
	}
	if err := a.running(); err != nil {
		return nil, err
	}
	c, err := a.dial(ctx, id)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.state == stateClosed {
		a.mu.Unlock()
		c.close(errAgentClosed)
		return nil, fmt.Errorf("%w: rpc: agent %s is shut down", ErrClosed, a.self)
	}
	s.cur.Store(c)
	a.wg.Add(1)
	a.mu.Unlock()
	go c.readLoop()
	return c, nil
}

func (a *Agent) dial(ctx context.Context, id int) (*conn, error) {
	peer, addr := a.workers[id], a.addrs[id]
	d := net.Dialer{KeepAlive: 15 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxError(ctx, fmt.Sprintf("rpc: connecting to worker %s at %s", peer, addr))
		}
		return nil, fmt.Errorf("%w: rpc: cannot reach worker %s at %s: %v", ErrPeerLost, peer, addr, err)
	}
	a.tuneSocket(nc)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if a.opts.tls != nil {
		cfg := a.opts.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("%w: rpc: TLS handshake with worker %s at %s: %v", ErrUnauthorized, peer, addr, err)
		}
		nc = tc
	}
	hello := make([]byte, 0, len(helloMagic)+7+len(a.token))
	hello = append(hello, helloMagic...)
	hello = append(hello, helloVersion)
	hello = binary.LittleEndian.AppendUint32(hello, uint32(a.self.ID))
	hello = binary.LittleEndian.AppendUint16(hello, uint16(len(a.token)))
	hello = append(hello, a.token...)
	mine, probe := a.newCMAHello()
	hello = mine.append(hello)
	br := bufio.NewReaderSize(nc, 64<<10)
	var theirs cmaHello
	var sendByRef, recvByRef bool
	status, msg, err := func() (byte, string, error) {
		if _, err := nc.Write(hello); err != nil {
			return 0, "", err
		}
		var h [3]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return 0, "", err
		}
		m := make([]byte, binary.LittleEndian.Uint16(h[1:]))
		if _, err := io.ReadFull(br, m); err != nil {
			return 0, "", err
		}
		if h[0] != statusOK {
			return h[0], string(m), nil
		}
		var err error
		if theirs, err = readCMAHello(br); err != nil {
			return 0, "", err
		}
		b, err := br.ReadByte()
		if err != nil {
			return 0, "", err
		}
		sendByRef = b == 1
		recvByRef = mine.canRead(theirs)
		confirm := byte(0)
		if recvByRef {
			confirm = 1
		}
		_, err = nc.Write([]byte{confirm})
		return statusOK, "", err
	}()
	runtime.KeepAlive(probe)
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctxError(ctx, fmt.Sprintf("rpc: handshake with worker %s at %s", peer, addr))
		}
		return nil, fmt.Errorf("%w: rpc: handshake with worker %s at %s: %v", ErrPeerLost, peer, addr, err)
	}
	switch status {
	case statusOK:
	case statusBadToken:
		nc.Close()
		return nil, fmt.Errorf("%w: rpc: worker %s refused this worker's token: %s (all workers need the same WithToken or TANDEM_TOKEN)", ErrUnauthorized, peer, msg)
	default:
		nc.Close()
		return nil, fmt.Errorf("%w: rpc: worker %s refused the connection: %s", ErrMismatch, peer, msg)
	}
	nc.SetDeadline(time.Time{})
	return newConn(a, nc, peer, true, br, theirs.pid, sendByRef, recvByRef), nil
}

func (a *Agent) acceptLoop() {
	defer a.wg.Done()
	var delay time.Duration
	for {
		nc, err := a.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait a little and go on.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay < time.Second {
				delay *= 2
			}
			a.opts.logger.Warn("rpc: accept failed", "worker", a.self.Name, "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
				continue
			case <-a.baseCtx.Done():
				return
			}
		}
		delay = 0
		a.mu.Lock()
		if a.state == stateClosed {
			a.mu.Unlock()
			nc.Close()
			return
		}
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serveConn(nc)
	}
}

// serveConn checks a new connection's hello and then reads its calls. It
// holds one count of a.wg, which the read loop takes over.
func (a *Agent) serveConn(nc net.Conn) {
	c := a.handshake(nc)
	if c == nil {
		a.wg.Done()
		return
	}
	c.readLoop()
}

// handshake checks a new connection's hello; nil means refused.
func (a *Agent) handshake(nc net.Conn) *conn {
	a.tuneSocket(nc)
	nc.SetDeadline(time.Now().Add(a.opts.handshakeLimit))
	raw := nc
	stop := context.AfterFunc(a.baseCtx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	if a.opts.tls != nil {
		tc := tls.Server(nc, a.opts.tls)
		if err := tc.HandshakeContext(a.baseCtx); err != nil {
			a.m.refused.Add(1)
			a.opts.logger.Warn("rpc: TLS handshake failed", "worker", a.self.Name, "remote", nc.RemoteAddr().String(), "err", err)
			nc.Close()
			return nil
		}
		nc = tc
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	reply := func(status byte, msg string) error {
		b := []byte{status, 0, 0}
		binary.LittleEndian.PutUint16(b[1:], uint16(len(msg)))
		_, err := nc.Write(append(b, msg...))
		return err
	}
	refuse := func(status byte, msg string) {
		a.m.refused.Add(1)
		a.opts.logger.Warn("rpc: refused a connection", "worker", a.self.Name, "remote", nc.RemoteAddr().String(), "reason", msg)
		reply(status, msg)
		nc.Close()
	}
	var h [len(helloMagic) + 7]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	if string(h[:len(helloMagic)]) != helloMagic || h[len(helloMagic)] != helloVersion {
		refuse(statusBadHello, "not a Tandem RPC hello (or another protocol version)")
		return nil
	}
	id := int(binary.LittleEndian.Uint32(h[len(helloMagic)+1:]))
	tok := make([]byte, binary.LittleEndian.Uint16(h[len(helloMagic)+5:]))
	if _, err := io.ReadFull(br, tok); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	if subtle.ConstantTimeCompare(tok, a.token) != 1 {
		refuse(statusBadToken, "wrong token")
		return nil
	}
	if id < 0 || id >= len(a.workers) {
		refuse(statusBadHello, fmt.Sprintf("caller id %d is not in this group of %d", id, len(a.workers)))
		return nil
	}
	theirs, err := readCMAHello(br)
	if err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	mine, probe := a.newCMAHello()
	recvByRef := mine.canRead(theirs)
	ok := []byte{statusOK, 0, 0}
	ok = mine.append(ok)
	if recvByRef {
		ok = append(ok, 1)
	} else {
		ok = append(ok, 0)
	}
	if _, err := nc.Write(ok); err != nil {
		nc.Close()
		return nil
	}
	confirm, err := br.ReadByte()
	runtime.KeepAlive(probe)
	if err != nil {
		nc.Close()
		return nil
	}
	if !stop() {
		nc.Close()
		return nil
	}
	nc.SetDeadline(time.Time{})
	c := newConn(a, nc, a.workers[id], false, br, theirs.pid, confirm == 1, recvByRef)
	a.mu.Lock()
	if a.state == stateClosed {
		a.mu.Unlock()
		nc.Close()
		return nil
	}
	a.servers[c] = struct{}{}
	a.mu.Unlock()
	return c
}

// readLoop reads frames until the connection fails, holding one count of
// a.wg. On a server connection, a call to a sync function hands the reading
// to a new goroutine (with the count) and runs the function here.
func (c *conn) readLoop() {
	handler := c.readFrames()
	c.a.wg.Done()
	if handler != nil {
		handler()
	}
}

func (c *conn) readFrames() (handler func()) {
	hdr := make([]byte, frameHeaderLen)
	for {
		f, err := readFrame(c.br, hdr, c.a.opts.maxMessage, c.intern, c.fetch)
		if err != nil {
			var pe *protocolError
			if errors.As(err, &pe) {
				c.a.m.malformed.Add(1)
				c.a.opts.logger.Warn("rpc: closing a connection that sent a bad frame", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
			}
			c.close(peerGone(err))
			return nil
		}
		if f.flags&flagByRef != 0 {
			// The tensors are copied: the sender may go on.
			head, _, _ := appendHead(make([]byte, 0, frameHeaderLen+8), &frame{kind: kindReadDone, id: f.id})
			c.post(head)
		}
		if f.kind == kindReadDone {
			c.ackArrived(f.id)
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
			c.a.wg.Add(1)
			go c.readLoop()
			return h
		}
	}
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

// expectAck registers interest in the read-done frame of id.
func (c *conn) expectAck(id uint64) chan struct{} {
	ch := make(chan struct{})
	c.amu.Lock()
	c.acks[id] = ch
	c.amu.Unlock()
	return ch
}

func (c *conn) ackArrived(id uint64) {
	c.amu.Lock()
	ch := c.acks[id]
	delete(c.acks, id)
	c.amu.Unlock()
	if ch != nil {
		close(ch)
	}
}

func (c *conn) dropAck(id uint64) {
	c.amu.Lock()
	delete(c.acks, id)
	c.amu.Unlock()
}

// awaitAck waits until the peer has copied a by-reference frame's tensors,
// the connection failed, or give (a call's end) is closed.
func (c *conn) awaitAck(ch chan struct{}, id uint64, give <-chan struct{}, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ch:
	case <-c.done:
		return fmt.Errorf("%w: rpc: connection to worker %s lost before it copied the tensors", ErrPeerLost, c.peer)
	case <-give:
	case <-t.C:
	}
	select {
	case <-ch:
		c.a.m.byRef.Add(1)
		return nil
	default:
	}
	c.dropAck(id)
	return fmt.Errorf("%w: rpc: worker %s did not copy the tensors within %v", ErrTimeout, c.peer, limit)
}

// byRefOK reports whether a frame with these tensors goes by reference.
func (c *conn) byRefOK(ts []*tensor.Dense) bool {
	return c.sendByRef && c.dispatching.Load() == 0 && tensorBytes(ts) >= cmaThreshold
}

// tensorBytes sums the bytes of tensors.
func tensorBytes(ts []*tensor.Dense) int {
	n := 0
	for _, t := range ts {
		n += len(t.Header.Raw)
	}
	return n
}
