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
	"time"

	"github.com/tandemml/tandem/internal/admit"
)

// The connection handshake (version 2). The dialler sends
//
//	"TNDMRPC" version(1 byte) caller id (u32) token length (u16) token
//	same-host offer (cmaHelloLen bytes: see cma.go)
//
// and the acceptor answers one status byte (0 accepted, 1 wrong token, 2 bad
// hello), a u16 length and a message; when accepted, its own same-host
// offer, whose flags say whether it has already proved itself to the
// dialler's challenge. The dialler then proves itself to the acceptor's
// challenge where both offer same-host copies, takes the acceptor's proof,
// and sends one byte: bit 0 "I have proved myself to you", bit 1 "I read
// your tensors from your memory". The acceptor takes the dialler's proof if
// there is one and answers one byte, bit 1 meaning the same. Neither side
// waits for the other to prove itself before proving itself, and each
// proof is made before the byte that announces it, so the kernel has it
// queued when it is taken. After that the dialler sends requests and the
// acceptor sends replies, as frames (see frame.go).
//
// Version 1 carried each side's process id in its offer, and the other side
// read that process's memory if 16 bytes it named were there: a token
// holder could name any process. Version 2 carries no process id.
//
// Until the token is checked, the acceptor reads through a small buffer
// (admit.HelloBuffer), allows admit.HandshakeTimeout for the whole
// handshake, and counts the connection against the agent's admission gate
// (admit.MaxPending in all, admit.MaxPendingPerHost from one host); a
// connection over the gate's limits is closed as soon as it is accepted.
// Warnings about refused connections are rate-limited (admit.Warner).
const (
	helloMagic   = "TNDMRPC"
	helloVersion = 2

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
	hello := make([]byte, 0, len(helloMagic)+7+len(a.token)+cmaHelloLen)
	hello = append(hello, helloMagic...)
	hello = append(hello, helloVersion)
	hello = binary.LittleEndian.AppendUint32(hello, uint32(a.self.ID))
	hello = binary.LittleEndian.AppendUint16(hello, uint16(len(a.token)))
	hello = append(hello, a.token...)
	side := a.newCMASide()
	defer side.close()
	hello = side.hello.append(hello)
	br := bufio.NewReaderSize(nc, 64<<10)
	var peerPID int
	var sendByRef bool
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
		theirs, err := readCMAHello(br)
		if err != nil {
			return 0, "", err
		}
		var mine byte
		if side.prove(ctx, theirs, nc) {
			mine |= cmaSentProof
		}
		if theirs.flags&cmaProved != 0 {
			peerPID = side.verify(ctx, theirs, nc)
		}
		if peerPID != 0 {
			mine |= cmaReadsYou
		}
		if _, err := nc.Write([]byte{mine}); err != nil {
			return 0, "", err
		}
		b, err := br.ReadByte()
		if err != nil {
			return 0, "", err
		}
		sendByRef = b&cmaReadsYou != 0 && mine&cmaSentProof != 0
		return statusOK, "", nil
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
	return newConn(a, nc, peer, true, br, peerPID, sendByRef, peerPID != 0), nil
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
		done, ok := a.gate.Admit(nc.RemoteAddr())
		if !ok {
			// Over the limit of connections in their handshake: close it
			// before anything is spent on it.
			nc.Close()
			a.m.refused.Add(1)
			a.warn.Warn("rpc: refused connections: too many in their handshake", "worker", a.self.Name,
				"remote", nc.RemoteAddr().String(), "max", admit.MaxPending, "max_per_host", admit.MaxPendingPerHost)
			continue
		}
		a.mu.Lock()
		if a.state == stateClosed {
			a.mu.Unlock()
			done()
			nc.Close()
			return
		}
		a.wg.Add(1)
		a.mu.Unlock()
		go a.serveConn(nc, done)
	}
}

// serveConn checks a new connection's hello and then reads its calls. It
// holds one count of a.wg, which the read loop takes over, and the
// connection's admission, which it gives back when the handshake ends.
func (a *Agent) serveConn(nc net.Conn, admitted func()) {
	c := a.handshake(nc, admitted)
	if c == nil {
		a.wg.Done()
		return
	}
	c.readLoop()
}

// handshake checks a new connection's hello; nil means refused. It calls
// admitted when the handshake has ended.
func (a *Agent) handshake(nc net.Conn, admitted func()) *conn {
	defer admitted()
	a.tuneSocket(nc)
	limit := a.opts.handshakeLimit
	if limit <= 0 {
		limit = admit.HandshakeTimeout
	}
	deadline := time.Now().Add(limit)
	nc.SetDeadline(deadline)
	ctx, cancel := context.WithDeadline(a.baseCtx, deadline)
	defer cancel()
	raw := nc
	stop := context.AfterFunc(a.baseCtx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	remote := nc.RemoteAddr().String()
	if a.opts.tls != nil {
		tc := tls.Server(nc, a.opts.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			a.m.refused.Add(1)
			a.warn.Warn("rpc: TLS handshake failed", "worker", a.self.Name, "remote", remote, "err", err)
			nc.Close()
			return nil
		}
		nc = tc
	}
	// A small buffer until the token is checked: an idle or hostile
	// connection costs little.
	small := bufio.NewReaderSize(nc, admit.HelloBuffer)
	reply := func(status byte, msg string) error {
		b := []byte{status, 0, 0}
		binary.LittleEndian.PutUint16(b[1:], uint16(len(msg)))
		_, err := nc.Write(append(b, msg...))
		return err
	}
	refuse := func(status byte, msg string) {
		a.m.refused.Add(1)
		a.warn.Warn("rpc: refused a connection", "worker", a.self.Name, "remote", remote, "reason", msg)
		reply(status, msg)
		nc.Close()
	}
	var h [len(helloMagic) + 7]byte
	if _, err := io.ReadFull(small, h[:]); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	if string(h[:len(helloMagic)]) != helloMagic || h[len(helloMagic)] != helloVersion {
		refuse(statusBadHello, fmt.Sprintf("not a Tandem RPC hello of version %d (another program, or a worker of another Tandem version)", helloVersion))
		return nil
	}
	id := int(binary.LittleEndian.Uint32(h[len(helloMagic)+1:]))
	n := int(binary.LittleEndian.Uint16(h[len(helloMagic)+5:]))
	if n != len(a.token) {
		// Not the token (ConstantTimeCompare would say so at once too);
		// nothing is allocated for what the peer announces.
		refuse(statusBadToken, "wrong token")
		return nil
	}
	tok := make([]byte, n)
	if _, err := io.ReadFull(small, tok); err != nil {
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
	// Authenticated: the full buffer, taking over what the small one holds.
	br := bufio.NewReaderSize(small, 64<<10)
	theirs, err := readCMAHello(br)
	if err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	side := a.newCMASide()
	defer side.close()
	offer := side.hello
	if side.prove(ctx, theirs, nc) {
		offer.flags |= cmaProved
	}
	ok := []byte{statusOK, 0, 0}
	ok = offer.append(ok)
	if _, err := nc.Write(ok); err != nil {
		nc.Close()
		return nil
	}
	b, err := br.ReadByte()
	if err != nil {
		nc.Close()
		return nil
	}
	var peerPID int
	if b&cmaSentProof != 0 {
		peerPID = side.verify(ctx, theirs, nc)
	}
	var mine byte
	if peerPID != 0 {
		mine |= cmaReadsYou
	}
	if _, err := nc.Write([]byte{mine}); err != nil {
		nc.Close()
		return nil
	}
	if !stop() {
		nc.Close()
		return nil
	}
	nc.SetDeadline(time.Time{})
	sendByRef := b&cmaReadsYou != 0 && offer.flags&cmaProved != 0
	c := newConn(a, nc, a.workers[id], false, br, peerPID, sendByRef, peerPID != 0)
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
