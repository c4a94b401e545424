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
	"sync"
	"sync/atomic"
	"time"
)

// The connection handshake. The dialler sends
//
//	"TNDMRPC" version(1 byte) caller id (u32) token length (u16) token
//
// and the acceptor answers one status byte (0 accepted, 1 wrong token, 2 bad
// hello), a u16 length and a message. After that the dialler sends requests
// and the acceptor sends replies, as frames (see frame.go).
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
	running map[uint64]context.CancelFunc

	closeOnce sync.Once
}

func newConn(a *Agent, nc net.Conn, peer WorkerInfo, client bool, br *bufio.Reader) *conn {
	c := &conn{a: a, nc: nc, peer: peer, client: client, br: br}
	c.wcond.L = &c.wmu
	if client {
		c.pending = map[uint64]*pendingCall{}
	} else {
		c.running = map[uint64]context.CancelFunc{}
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
	for len(c.queue) > 0 && c.werr == nil {
		batch := c.queue
		c.queue = c.spare[:0]
		c.gen++
		g := c.gen
		c.wmu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(c.a.opts.timeout))
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

// close shuts the connection and fails every call waiting on it.
func (c *conn) close(reason error) {
	c.closeOnce.Do(func() {
		c.nc.Close()
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
			for _, cancel := range c.running {
				cancel()
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

// connTo returns the connection to worker id, dialling it if needed.
func (a *Agent) connTo(ctx context.Context, id int) (*conn, error) {
	s := a.peers[id]
	if c := s.cur.Load(); c != nil && !c.dead.Load() {
		return c, nil
	}
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
	br := bufio.NewReaderSize(nc, 64<<10)
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
		return h[0], string(m), nil
	}()
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
	return newConn(a, nc, peer, true, br), nil
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

// serveConn checks a new connection's hello and then reads its calls.
func (a *Agent) serveConn(nc net.Conn) {
	defer a.wg.Done()
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
			return
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
		return
	}
	if string(h[:len(helloMagic)]) != helloMagic || h[len(helloMagic)] != helloVersion {
		refuse(statusBadHello, "not a Tandem RPC hello (or another protocol version)")
		return
	}
	id := int(binary.LittleEndian.Uint32(h[len(helloMagic)+1:]))
	tok := make([]byte, binary.LittleEndian.Uint16(h[len(helloMagic)+5:]))
	if _, err := io.ReadFull(br, tok); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return
	}
	if subtle.ConstantTimeCompare(tok, a.token) != 1 {
		refuse(statusBadToken, "wrong token")
		return
	}
	if id < 0 || id >= len(a.workers) {
		refuse(statusBadHello, fmt.Sprintf("caller id %d is not in this group of %d", id, len(a.workers)))
		return
	}
	if err := reply(statusOK, ""); err != nil {
		nc.Close()
		return
	}
	if !stop() {
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	c := newConn(a, nc, a.workers[id], false, br)
	a.mu.Lock()
	if a.state == stateClosed {
		a.mu.Unlock()
		nc.Close()
		return
	}
	a.servers[c] = struct{}{}
	a.mu.Unlock()
	c.readLoop0()
}

// readLoop reads frames until the connection fails.
func (c *conn) readLoop() {
	defer c.a.wg.Done()
	c.readLoop0()
}

func (c *conn) readLoop0() {
	hdr := make([]byte, frameHeaderLen)
	for {
		f, err := readFrame(c.br, hdr, c.a.opts.maxMessage)
		if err != nil {
			var pe *protocolError
			if errors.As(err, &pe) {
				c.a.m.malformed.Add(1)
				c.a.opts.logger.Warn("rpc: closing a connection that sent a bad frame", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
			}
			c.close(peerGone(err))
			return
		}
		if c.client {
			c.a.onReply(c, f)
		} else {
			c.a.onRequest(c, f)
		}
	}
}
