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
	"time"
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
