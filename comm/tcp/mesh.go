package tcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// Store keys; every key this backend writes is under "tcp/".
const (
	keyNonce    = "tcp/nonce"
	keyAddrBase = "tcp/addr/"
)

// dialAttemptTimeout bounds one attempt to reach one advertised address.
const dialAttemptTimeout = 3 * time.Second

func addrKey(rank int) string { return keyAddrBase + strconv.Itoa(rank) }

// link is the outcome of one connection attempt, sent to the collector.
type link struct {
	rank int
	conn *net.TCPConn
	err  error  // fatal: Connect fails with it
	note string // a refused connection, reported if the mesh times out
}

// maxNotes bounds the refused connections a set-up timeout error lists; the
// others are counted.
const maxNotes = 8

// meshState is shared by the goroutines that build the mesh.
type meshState struct {
	b     Backend
	cfg   transport.Config
	nonce [nonceSize]byte
	out   chan link
	// gate caps the connections in their handshake with the listener, so
	// that a flood of connections to it while the mesh forms costs a bounded
	// amount of memory; busy counts those it turned away.
	gate *admit.Gate
	busy atomic.Int64

	mu      sync.Mutex
	claimed map[int]bool // ranks that completed a handshake with our listener
}

// send hands l to the collector, or closes its connection when set-up is over.
func (m *meshState) send(ctx context.Context, l link) {
	select {
	case m.out <- l:
	case <-ctx.Done():
		if l.conn != nil {
			l.conn.Close()
		}
	}
}

// mesh connects to every peer: dials lower ranks, accepts higher ranks.
// It returns one connection per peer (nil at the own rank).
func (b Backend) mesh(ctx, parent context.Context, cfg transport.Config, timeout time.Duration) ([]*net.TCPConn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	ln, advertised, err := b.listen()
	if err != nil {
		return nil, fmt.Errorf("tcp: rank %d: listening for peers: %w", cfg.Rank, err)
	}
	defer ln.Close()
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopLn()

	m := &meshState{b: b, cfg: cfg, out: make(chan link, 4*cfg.Size), claimed: map[int]bool{},
		gate: admit.NewGate(admit.MaxPending, admit.MaxPendingPerHost)}
	if err := m.exchangeNonce(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, m.timeoutError(ctx, parent, make([]*net.TCPConn, cfg.Size), nil, timeout)
		}
		return nil, err
	}
	if err := cfg.Store.Set(ctx, addrKey(cfg.Rank), []byte(strings.Join(advertised, ","))); err != nil {
		return nil, fmt.Errorf("tcp: rank %d: publishing its address in the store: %w", cfg.Rank, err)
	}

	var wg sync.WaitGroup
	if cfg.Rank < cfg.Size-1 {
		wg.Add(1)
		go func() { defer wg.Done(); m.acceptLoop(ctx, ln, &wg) }()
	}
	for p := 0; p < cfg.Rank; p++ {
		wg.Add(1)
		go func() { defer wg.Done(); m.dialPeer(ctx, p) }()
	}

	conns := make([]*net.TCPConn, cfg.Size)
	need := cfg.Size - 1
	var notes []string
	var moreNotes, moreToken int
	var fail error
	for need > 0 && fail == nil {
		select {
		case l := <-m.out:
			switch {
			case l.err != nil:
				fail = l.err
			case l.note != "":
				// A flood of junk connections must not grow the list without end.
				if len(notes) < maxNotes {
					notes = append(notes, l.note)
				} else {
					moreNotes++
					if strings.Contains(l.note, "token") {
						moreToken++
					}
				}
			default:
				conns[l.rank] = l.conn
				need--
			}
		case <-ctx.Done():
			if moreNotes > 0 {
				more := fmt.Sprintf("and %d more", moreNotes)
				if moreToken > 0 {
					more += fmt.Sprintf(", %d of them with a token that does not match", moreToken)
				}
				notes = append(notes, more)
			}
			fail = m.timeoutError(ctx, parent, conns, notes, timeout)
		}
	}
	cancel()
	ln.Close()
	wg.Wait()
	for {
		select {
		case l := <-m.out:
			if l.conn != nil {
				if fail == nil && conns[l.rank] == nil {
					conns[l.rank] = l.conn
					continue
				}
				l.conn.Close()
			}
			continue
		default:
		}
		break
	}
	if fail != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, fail
	}
	return conns, nil
}

// exchangeNonce makes rank 0 publish a fresh per-run nonce and the others read it.
func (m *meshState) exchangeNonce(ctx context.Context) error {
	if m.cfg.Rank == 0 {
		if _, err := rand.Read(m.nonce[:]); err != nil {
			return fmt.Errorf("tcp: generating the run nonce: %w", err)
		}
		if err := m.cfg.Store.Set(ctx, keyNonce, []byte(hex.EncodeToString(m.nonce[:]))); err != nil {
			return fmt.Errorf("tcp: rank 0: publishing the run nonce in the store: %w", err)
		}
		return nil
	}
	v, err := m.get(ctx, keyNonce)
	if err != nil {
		return fmt.Errorf("tcp: rank %d: waiting for rank 0 to publish the run nonce (is rank 0 running?): %w", m.cfg.Rank, err)
	}
	n, err := hex.DecodeString(string(v))
	if err != nil || len(n) != nonceSize {
		return fmt.Errorf("tcp: store key %q holds %q, not a run nonce: %w", keyNonce, v, transport.ErrMismatch)
	}
	copy(m.nonce[:], n)
	return nil
}

func (m *meshState) timeoutError(ctx, parent context.Context, conns []*net.TCPConn, notes []string, timeout time.Duration) error {
	var missing []int
	for r, c := range conns {
		if r != m.cfg.Rank && c == nil {
			missing = append(missing, r)
		}
	}
	// Tell "never started" apart from "started but unreachable".
	var unpublished []int
	cctx, cancel := context.WithTimeout(context.WithoutCancel(parent), time.Second)
	defer cancel()
	for _, r := range missing {
		if ok, err := m.cfg.Store.Check(cctx, []string{addrKey(r)}); err == nil && !ok {
			unpublished = append(unpublished, r)
		}
	}
	msg := fmt.Sprintf("tcp: rank %d of %d: no connection from ranks %v", m.cfg.Rank, m.cfg.Size, missing)
	if len(unpublished) > 0 {
		msg += fmt.Sprintf(" (ranks %v never published an address: are they running, with the same store?)", unpublished)
	}
	if parent.Err() == nil {
		msg += fmt.Sprintf(" within the set-up timeout %v", timeout)
	}
	var unauthorized bool
	if len(notes) > 0 {
		sort.Strings(notes)
		msg += "; refused connections: " + strings.Join(notes, "; ")
		for _, n := range notes {
			if strings.Contains(n, "token") {
				unauthorized = true
			}
		}
	}
	if n := m.busy.Load(); n > 0 {
		msg += fmt.Sprintf("; %d connections were turned away because too many were in their handshake already "+
			"(at most %d in all and %d from one host: a flood of connections to the listener?)",
			n, admit.MaxPending, admit.MaxPendingPerHost)
	}
	if unauthorized {
		return errs.Wrap(ctx, msg, transport.ErrUnauthorized)
	}
	return errs.FromContext(ctx, msg)
}

// listen opens the listener and returns the addresses to advertise.
func (b Backend) listen() (*net.TCPListener, []string, error) {
	var lc net.ListenConfig
	lc.KeepAliveConfig = keepAlive
	addr := ":0"
	if b.host != "" {
		addr = net.JoinHostPort(b.host, "0")
	}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	ln := l.(*net.TCPListener)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if b.host != "" {
		return ln, []string{net.JoinHostPort(b.host, port)}, nil
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("listing this machine's addresses (use tcp.WithHost to name one): %w", err)
	}
	var global, loop []string
	for _, a := range ifaddrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsUnspecified() || ipn.IP.IsMulticast() {
			continue
		}
		hp := net.JoinHostPort(ipn.IP.String(), port)
		if ipn.IP.IsLoopback() {
			loop = append(loop, hp)
		} else {
			global = append(global, hp)
		}
	}
	out := append(global, loop...)
	if len(out) == 0 {
		out = []string{net.JoinHostPort("127.0.0.1", port)}
	}
	return ln, out, nil
}

var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

func (b Backend) tune(c *net.TCPConn) {
	c.SetNoDelay(true)
	c.SetKeepAliveConfig(keepAlive)
	if n := b.socketBuffer(); n > 0 {
		c.SetReadBuffer(n)
		c.SetWriteBuffer(n)
	}
}

// handshakeTimeout bounds one handshake, so that an address that accepts but
// never answers (not a Tandem rank) does not hold up the others, and a
// connection to the listener that never says hello does not hold its slot
// in the gate for long.
const handshakeTimeout = admit.HandshakeTimeout

// guard bounds the handshake I/O on c by ctx and handshakeTimeout; the returned func ends the guard
// and reports whether ctx fired meanwhile.
func guard(ctx context.Context, c net.Conn) func() bool {
	d := time.Now().Add(handshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	c.SetDeadline(d)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() bool {
		fired := !stop()
		c.SetDeadline(time.Time{})
		return fired
	}
}

// acceptLoop accepts peers' connections until ctx ends. A connection over
// the gate's caps is closed at once (its dialer, if a rank, tries again);
// the others get a goroutine for their handshake, which reads the hello into
// a fixed-size array: nothing grows with what a connection announces.
func (m *meshState) acceptLoop(ctx context.Context, ln *net.TCPListener, wg *sync.WaitGroup) {
	backoff := time.Millisecond
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if transientAccept(err) {
				// Out of file descriptors (a flood holding them, say): wait
				// for some to close rather than fail the set-up.
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			m.send(ctx, link{err: fmt.Errorf("tcp: rank %d: accepting peer connections: %w", m.cfg.Rank, err)})
			return
		}
		backoff = time.Millisecond
		admitted, ok := m.gate.Admit(c.RemoteAddr())
		if !ok {
			m.busy.Add(1)
			c.SetLinger(0) // a reset: no socket left in TIME_WAIT here
			c.Close()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); m.accept(ctx, c, admitted) }()
	}
}

// transientAccept reports whether an accept error passes with time.
func transientAccept(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// accept runs the acceptor's side of the handshake on c; admitted frees its
// slot in the gate.
func (m *meshState) accept(ctx context.Context, c *net.TCPConn, admitted func()) {
	done := guard(ctx, c)
	l := m.acceptHandshake(c)
	admitted()
	if done() && l.conn != nil {
		// Set-up ended while we answered: the collector is gone.
		l.conn.Close()
		return
	}
	if l.conn == nil {
		c.Close()
	}
	m.send(ctx, l)
}

func (m *meshState) acceptHandshake(c *net.TCPConn) link {
	from := c.RemoteAddr().String()
	me, size := m.cfg.Rank, m.cfg.Size
	h, err := readHello(c, kindHello)
	if err != nil {
		if errors.Is(err, errVersion) {
			// Tell the dialer, in this version's records, why.
			writeHello(c, &hello{kind: kindReply, status: statusVersion, rank: uint32(me), size: uint32(size), nonce: m.nonce})
		}
		return link{note: fmt.Sprintf("%s: bad hello: %v", from, err)}
	}
	// Challenge the dialer with a fresh nonce; look at nothing in its hello
	// until its proof verifies.
	ch := hello{kind: kindChallenge, rank: uint32(me), size: uint32(size), peer: h.rank, nonce: m.nonce}
	an, err := tokenauth.NewNonce()
	if err != nil {
		return link{note: fmt.Sprintf("%s: %v", from, err)}
	}
	ch.data = an
	if err := writeHello(c, &ch); err != nil {
		return link{note: fmt.Sprintf("%s claiming rank %d: sending the challenge: %v", from, h.rank, err)}
	}
	proof, err := readHello(c, kindProof)
	if err != nil {
		return link{note: fmt.Sprintf("%s claiming rank %d: no proof of the token: %v", from, h.rank, err)}
	}
	key := tokenauth.NewKey([]byte(m.cfg.Token), authProtocol)
	reply := hello{kind: kindReply, rank: uint32(me), size: uint32(size), peer: h.rank, nonce: m.nonce}
	var l link
	switch {
	case !key.Verify(tokenauth.Dialer, h.data, ch.data, proof.data, h.body(), ch.body()):
		reply.status = statusUnauthorized
		l.note = fmt.Sprintf("%s claiming rank %d: token does not match", from, h.rank)
	case h.size != uint32(size):
		reply.status = statusSizeMismatch
		l.err = fmt.Errorf("tcp: world size mismatch: rank %d has world size %d but rank %d (%s) has world size %d; start every rank with the same WORLD_SIZE: %w",
			me, size, h.rank, from, h.size, transport.ErrMismatch)
	case h.nonce != m.nonce:
		reply.status = statusOtherRun
		l.note = fmt.Sprintf("%s claiming rank %d belongs to another run (different nonce)", from, h.rank)
	case h.peer != uint32(me) || h.rank <= uint32(me) || h.rank >= uint32(size):
		reply.status = statusWrongRank
		l.note = fmt.Sprintf("%s claiming rank %d wanted rank %d", from, h.rank, h.peer)
	default:
		m.mu.Lock()
		dup := m.claimed[int(h.rank)]
		m.claimed[int(h.rank)] = true
		m.mu.Unlock()
		if dup {
			reply.status = statusDuplicate
			l.note = fmt.Sprintf("%s claims rank %d, which is already connected: two processes were given rank %d", from, h.rank, h.rank)
		} else {
			l.rank, l.conn = int(h.rank), c
		}
	}
	if reply.status == statusOK {
		reply.data = proveAcceptor(key, h, &ch, &reply)
	}
	if err := writeHello(c, &reply); err != nil {
		if l.conn != nil {
			m.mu.Lock()
			delete(m.claimed, l.rank)
			m.mu.Unlock()
			return link{note: fmt.Sprintf("%s claiming rank %d: answering the hello: %v", from, h.rank, err)}
		}
		return l
	}
	if l.conn != nil {
		m.b.tune(c)
	}
	return l
}

// get reads key, waiting for it until ctx ends even when the store's own
// default timeout is shorter.
func (m *meshState) get(ctx context.Context, key string) ([]byte, error) {
	for {
		v, err := m.cfg.Store.Get(ctx, key)
		if err == nil || ctx.Err() != nil || !errors.Is(err, transport.ErrTimeout) {
			return v, err
		}
	}
}

// dialPeer connects to the lower rank p, retrying until ctx ends.
func (m *meshState) dialPeer(ctx context.Context, p int) {
	v, err := m.get(ctx, addrKey(p))
	if err != nil {
		if ctx.Err() == nil {
			m.send(ctx, link{err: fmt.Errorf("tcp: rank %d: reading rank %d's address from the store: %w", m.cfg.Rank, p, err)})
		}
		return // on ctx's end the collector reports the missing rank
	}
	addrs := strings.Split(string(v), ",")
	// Each address gets a bounded attempt, so that an unreachable one (a
	// network the dialer is not on) does not hold up the next.
	d := net.Dialer{KeepAliveConfig: keepAlive, Timeout: dialAttemptTimeout}
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		for _, a := range addrs {
			c, err := d.DialContext(ctx, "tcp", a)
			if err != nil {
				continue
			}
			tc := c.(*net.TCPConn)
			l, retry := m.dialHandshake(ctx, tc, p, a)
			if l.conn == nil {
				tc.Close()
			}
			if retry {
				continue
			}
			m.send(ctx, l)
			return
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, time.Second)
	}
}

// dialHandshake runs the dialer's side of the handshake; retry reports a
// failure worth trying the next address for.
func (m *meshState) dialHandshake(ctx context.Context, c *net.TCPConn, p int, addr string) (l link, retry bool) {
	me, size := m.cfg.Rank, m.cfg.Size
	h := hello{kind: kindHello, rank: uint32(me), size: uint32(size), peer: uint32(p), nonce: m.nonce}
	dn, err := tokenauth.NewNonce()
	if err != nil {
		return link{err: fmt.Errorf("tcp: rank %d: %w", me, err)}, false
	}
	h.data = dn
	key := tokenauth.NewKey([]byte(m.cfg.Token), authProtocol)
	done := guard(ctx, c)
	var ch, r *hello
	err = writeHello(c, &h)
	if err == nil {
		ch, err = readHello(c, kindChallenge)
	}
	if err == nil {
		proof := hello{kind: kindProof, rank: h.rank, size: h.size, peer: h.peer, nonce: h.nonce, data: proveDialer(key, &h, ch)}
		err = writeHello(c, &proof)
	}
	if err == nil {
		r, err = readHello(c, kindReply)
	}
	if done() {
		return link{}, true
	}
	if errors.Is(err, errVersion) {
		return link{err: fmt.Errorf("tcp: rank %d at %s: %w", p, addr, err)}, false
	}
	if err != nil {
		return link{}, true
	}
	switch r.status {
	case statusOK:
	case statusUnauthorized:
		return link{err: fmt.Errorf("tcp: rank %d refused the connection from rank %d: the token does not match; give every rank the same token (TANDEM_TOKEN): %w",
			p, me, transport.ErrUnauthorized)}, false
	case statusSizeMismatch:
		return link{err: fmt.Errorf("tcp: world size mismatch: rank %d has world size %d but rank %d (%s) has world size %d; start every rank with the same WORLD_SIZE: %w",
			me, size, p, addr, r.size, transport.ErrMismatch)}, false
	case statusOtherRun:
		return link{err: fmt.Errorf("tcp: rank %d at %s belongs to another run than rank %d (different nonce); is a stale process using the same store? %w",
			p, addr, me, transport.ErrMismatch)}, false
	case statusWrongRank:
		return link{}, true
	case statusVersion:
		return link{err: fmt.Errorf("tcp: rank %d at %s refused the connection: it speaks another process-group protocol version than this rank's %d; "+
			"run the same Tandem version on every rank: %w", p, addr, protoVersion, transport.ErrMismatch)}, false
	case statusDuplicate:
		return link{err: fmt.Errorf("tcp: rank %d already has a connection from a process claiming rank %d: two processes were given rank %d: %w",
			p, me, me, transport.ErrMismatch)}, false
	default:
		return link{err: fmt.Errorf("tcp: rank %d answered with unknown status %d: %w", p, r.status, transport.ErrMismatch)}, false
	}
	if !key.Verify(tokenauth.Acceptor, h.data, ch.data, r.data, h.body(), ch.body(), r.body()) {
		return link{err: fmt.Errorf("tcp: rank %d at %s could not prove it holds the token; give every rank the same token (TANDEM_TOKEN): %w",
			p, addr, transport.ErrUnauthorized)}, false
	}
	if r.rank != uint32(p) || r.nonce != m.nonce {
		return link{}, true
	}
	m.b.tune(c)
	return link{rank: p, conn: c}, false
}
