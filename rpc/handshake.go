package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// The connection handshake (version 4). Both sides prove that they hold
// the shared token by the challenge-response of internal/tokenauth
// (protocol name "tandem-rpc"), with fresh nonces on both sides; the token
// never crosses the wire. The dialler sends a hello
//
//	"TNDMRPC" version(1 byte) caller id (u32) 0 (u16) dialler nonce (32 bytes)
//
// and the acceptor answers a status: one byte (0 accepted, 1 wrong token, 2
// bad hello), a u16 length and a message; when accepted, its nonce (32
// bytes). The dialler sends its MAC (32 bytes) and its same-host offer
// (cmaHelloLen bytes: see cma.go). The acceptor checks the MAC and answers
// a second status; when accepted, its own MAC and its same-host offer, whose
// flags say whether it has already proved itself to the dialler's
// challenge. Both MACs bind the hello's first 14 bytes (magic, version,
// caller id). The dialler checks the acceptor's MAC, proves itself to the
// acceptor's same-host challenge where both offer same-host copies, takes
// the acceptor's proof, and sends one byte: bit 0 "I have proved myself to
// you", bit 1 "I read your tensors from your memory". The acceptor takes the
// dialler's proof if there is one and answers one byte, bit 1 meaning the
// same. Neither side waits for the other to prove itself before proving
// itself, and each proof is made before the byte that announces it, so the
// kernel has it queued when it is taken. After that the dialler sends
// requests and the acceptor sends replies, as frames (see frame.go).
//
// Version 3 had the sender of a pushed tensor write the part after a cut
// the receiver chose, where version 4 has the two meet (push.go): a grant
// names four words, of which version 3 knew two. Version 2 sent the token
// itself in the hello (where versions 3 and 4 have zero and the nonce);
// version 1 also carried each side's process id in its offer, and the other
// side read that process's memory if 16 bytes it named were there: a token
// holder could name any process. A worker refuses a hello of another
// version with a status naming both versions; the first 14 bytes of the
// hello have kept their layout, so workers of versions 2, 3 and 4 refuse
// each other that way.
//
// Until the dialler's MAC is checked, the acceptor reads through a small
// buffer (admit.HelloBuffer) and nothing it reads has a size the dialler
// chose; it allows admit.HandshakeTimeout for the whole handshake, and
// counts the connection against the agent's admission gate
// (admit.MaxPending in all, admit.MaxPendingPerHost from one host); a
// connection over the gate's limits is closed as soon as it is accepted.
// Warnings about refused connections are rate-limited (admit.Warner).
const (
	helloMagic   = "TNDMRPC"
	helloVersion = 4 // 4: pushed tensors are copied from both ends until they meet; 3: the token is proved by challenge-response (internal/tokenauth), never sent

	statusOK       = 0
	statusBadToken = 1
	statusBadHello = 2

	// helloHeaderLen is the part of the hello whose layout every version
	// shares: magic, version, caller id and a u16 (version 2's token length).
	helloHeaderLen = len(helloMagic) + 7
	// authProtocol names RPC's key derivation in internal/tokenauth.
	authProtocol = "tandem-rpc"
)

// helloHeader returns the first helloHeaderLen bytes of a hello from caller id.
func helloHeader(id int) [helloHeaderLen]byte {
	var h [helloHeaderLen]byte
	copy(h[:], helloMagic)
	h[len(helloMagic)] = helloVersion
	binary.LittleEndian.PutUint32(h[len(helloMagic)+1:], uint32(id))
	return h
}

// readStatus reads a status of the handshake: its byte and its message.
func readStatus(br *bufio.Reader) (byte, string, error) {
	var h [3]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, "", err
	}
	m := make([]byte, binary.LittleEndian.Uint16(h[1:]))
	if _, err := io.ReadFull(br, m); err != nil {
		return 0, "", err
	}
	return h[0], string(m), nil
}

// errImpostor is the dialler's finding that the acceptor's MAC does not
// verify.
var errImpostor = errors.New("the worker could not prove that it holds this worker's token")

// dialAuth runs the dialler's side of the token's challenge-response on w
// and br as caller id, sending offer (a same-host offer) with its MAC. It
// returns the acceptor's status and message; statusOK means that both sides
// have proved themselves, and the acceptor's same-host offer is next in br.
// An acceptor that accepts without a valid MAC yields errImpostor.
func dialAuth(w io.Writer, br *bufio.Reader, token []byte, id int, offer []byte) (byte, string, error) {
	mine, err := tokenauth.NewNonce()
	if err != nil {
		return 0, "", err
	}
	hdr := helloHeader(id)
	hello := append(hdr[:], mine[:]...)
	if _, err := w.Write(hello); err != nil {
		return 0, "", err
	}
	status, msg, err := readStatus(br)
	if err != nil || status != statusOK {
		return status, msg, err
	}
	var theirs tokenauth.Nonce
	if _, err := io.ReadFull(br, theirs[:]); err != nil {
		return 0, "", err
	}
	key := tokenauth.NewKey(token, authProtocol)
	mac := key.Prove(tokenauth.Dialer, mine, theirs, hdr[:])
	if _, err := w.Write(append(mac[:], offer...)); err != nil {
		return 0, "", err
	}
	if status, msg, err = readStatus(br); err != nil || status != statusOK {
		return status, msg, err
	}
	var verdict tokenauth.MAC
	if _, err := io.ReadFull(br, verdict[:]); err != nil {
		return 0, "", err
	}
	if !key.Verify(tokenauth.Acceptor, mine, theirs, verdict, hdr[:]) {
		return 0, "", errImpostor
	}
	return statusOK, "", nil
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
	a.mu.Unlock()
	if !a.life.goThen(c.readLoop) {
		c.close(errAgentClosed)
		return nil, fmt.Errorf("%w: rpc: agent %s is shut down", ErrClosed, a.self)
	}
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
	side := a.newCMASide()
	defer side.close()
	pr := newPollReader(nc)
	br := bufio.NewReaderSize(readerOf(nc, pr), 64<<10)
	var peerPID int
	var sendByRef, push bool
	status, msg, err := func() (byte, string, error) {
		status, msg, err := dialAuth(nc, br, a.token, a.self.ID, side.hello.append(nil))
		if err != nil || status != statusOK {
			return status, msg, err
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
		if a.opts.push && peerPID != 0 {
			mine |= cmaPushes
		}
		if _, err := nc.Write([]byte{mine}); err != nil {
			return 0, "", err
		}
		b, err := br.ReadByte()
		if err != nil {
			return 0, "", err
		}
		sendByRef = b&cmaReadsYou != 0 && mine&cmaSentProof != 0
		push = b&mine&cmaPushes != 0
		return statusOK, "", nil
	}()
	if errors.Is(err, errImpostor) {
		nc.Close()
		return nil, fmt.Errorf("%w: rpc: worker %s at %s could not prove that it holds this worker's token; "+
			"is another program listening there? (all workers need the same WithToken or TANDEM_TOKEN)", ErrUnauthorized, peer, addr)
	}
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
		return nil, fmt.Errorf("%w: rpc: worker %s refused the connection: %s (this worker speaks RPC protocol version %d)", ErrMismatch, peer, msg, helloVersion)
	}
	nc.SetDeadline(time.Time{})
	c := newConn(a, nc, peer, true, br, peerPID, sendByRef, peerPID != 0, push)
	c.pollFor(pr)
	return c, nil
}

func (a *Agent) acceptLoop(ctx context.Context) {
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
			case <-ctx.Done():
				return
			}
		}
		delay = 0
		done, ok := a.gate.Admit(nc.RemoteAddr())
		if !ok {
			// Over the limit of connections in their handshake: close it
			// before anything is spent on it (counted first, so that
			// whoever sees it closed sees it counted).
			a.m.refused.Add(1)
			nc.Close()
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
		a.mu.Unlock()
		if !a.life.goThen(func(context.Context) func() { return a.serveConn(nc, done) }) {
			done()
			nc.Close()
			return
		}
	}
}

// serveConn checks a new connection's hello and then reads its calls, in
// the agent's lifetime (it returns what readLoop returns). It holds the
// connection's admission, which it gives back when the handshake ends.
func (a *Agent) serveConn(nc net.Conn, admitted func()) (handler func()) {
	c := a.handshake(nc, admitted)
	if c == nil {
		return nil
	}
	return c.readLoop(a.life.ctx)
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
	ctx, cancel := context.WithDeadline(a.life.ctx, deadline)
	defer cancel()
	raw := nc
	stop := context.AfterFunc(a.life.ctx, func() { raw.SetDeadline(time.Now()) })
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
	pr := newPollReader(nc)
	small := bufio.NewReaderSize(readerOf(nc, pr), admit.HelloBuffer)
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
	var h [helloHeaderLen]byte
	if _, err := io.ReadFull(small, h[:]); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	if string(h[:len(helloMagic)]) != helloMagic {
		refuse(statusBadHello, fmt.Sprintf("not a Tandem RPC hello (another program?); this worker speaks RPC protocol version %d", helloVersion))
		return nil
	}
	if v := h[len(helloMagic)]; v != helloVersion {
		refuse(statusBadHello, fmt.Sprintf("the caller speaks RPC protocol version %d, this worker version %d; "+
			"run the same Tandem version on every worker", v, helloVersion))
		return nil
	}
	id := int(binary.LittleEndian.Uint32(h[len(helloMagic)+1:]))
	var dn tokenauth.Nonce
	if _, err := io.ReadFull(small, dn[:]); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	an, err := tokenauth.NewNonce()
	if err != nil {
		refuse(statusBadHello, err.Error())
		return nil
	}
	if _, err := nc.Write(append([]byte{statusOK, 0, 0}, an[:]...)); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	var mac tokenauth.MAC
	if _, err := io.ReadFull(small, mac[:]); err != nil {
		a.m.refused.Add(1)
		nc.Close()
		return nil
	}
	key := tokenauth.NewKey(a.token, authProtocol)
	if !key.Verify(tokenauth.Dialer, dn, an, mac, h[:]) {
		refuse(statusBadToken, "wrong token: the caller could not prove that it holds this worker's token")
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
	verdict := key.Prove(tokenauth.Acceptor, dn, an, h[:])
	ok := append([]byte{statusOK, 0, 0}, verdict[:]...)
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
	if a.opts.push && peerPID != 0 {
		mine |= cmaPushes
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
	c := newConn(a, nc, a.workers[id], false, br, peerPID, sendByRef, peerPID != 0, b&mine&cmaPushes != 0)
	c.pollFor(pr)
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
