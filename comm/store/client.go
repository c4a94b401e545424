package store

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/liveness"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// replyGrace is how long a client waits past a blocking request's own
// deadline for the server's answer before giving up on its own.
const replyGrace = 2 * time.Second

// TCPStore is a client of a TCP store server (and, when made by NewTCP with
// isServer, the owner of an embedded server). One TCPStore holds one
// connection, shared by every goroutine that uses it: requests carry ids, so
// many may be in flight at once.
//
// Blocking calls (Get, MultiGet, Wait) and reconnects are bounded by the
// caller's context: a context deadline governs however far off it is, and
// the store's timeout (WithTimeout) applies only to a context without one.
// Wait's own timeout argument bounds it as well.
//
// If the connection breaks, the client dials again (with backoff, for as
// long as the request's deadline allows) and sends every request that was
// in flight once more, under the same request id and client session:
//
//   - Reads (Get, MultiGet, Wait, Check, NumKeys) are simply repeated; a
//     blocked Get or Wait resumes with what is left of its timeout.
//   - Writes (Set, MultiSet, Add, Append, CompareSet, DeleteKey) are marked
//     apply-at-most-once. The server remembers the replies of a session's
//     last 1024 such requests (and drops the session's old connection, and
//     waits until it stops, before serving the new one), so a repeated Add
//     whose first copy did arrive gets the first reply back instead of
//     counting twice, and one that never arrived runs now. A blind retry of
//     Add could count twice; this cannot.
//
// What is not covered: a server that restarted (it lost every key anyway),
// and a write repeated after more than 1024 newer writes of the same client
// were answered (many hundreds of goroutines writing through one client while
// its connection breaks); such a write may apply twice. When the server stays
// unreachable, requests fail with an error wrapping ErrTimeout and
// ErrPeerLost at their deadline. A server that is gone, its address refusing
// connections (the process serving the store exited), is noticed sooner:
// once a client that was connected has seen nothing but refused connections
// for GoneAfter, its requests fail with ErrPeerLost, naming the address and
// since when it refuses.
//
// A brief drop (a reset connection, a server that is slow to accept) is
// not refused and is reconnected as before.
type TCPStore struct {
	cfg     config
	addr    string
	session uint64

	server    *Server
	serveDone chan struct{}

	dialing   chan struct{} // a one-slot semaphore: one dial at a time
	mu        sync.Mutex
	cur       *clientConn
	connected bool // a connection was up once: later failures mean the server was lost
	closed    bool
	done      chan struct{}
	nextID    atomic.Uint64
	wg        sync.WaitGroup

	// goneAfter: how long a client that was connected redials an address
	// that refuses connections before it takes the server for gone.
	goneAfter time.Duration
	// refusedSince: when the dials began to be refused (zero while they are
	// not); guarded by mu.
	refusedSince time.Time
}

// GoneAfter is how long a TCP store client that was connected keeps
// redialling a server address that refuses connections (nothing listens
// there any more: the serving process exited or closed the store) before
// its calls fail with ErrPeerLost, whatever their deadline. Refusals before
// the first connection do not count: the server may not be up yet.
const GoneAfter = liveness.Timeout

var _ Store = (*TCPStore)(nil)

// Dial connects to the TCP store server at addr (host:port), retrying while
// the server is not up yet, until ctx's deadline (the store's timeout when
// ctx has none).
// Options: WithToken (default from TANDEM_TOKEN), WithTimeout, WithMaxFrame,
// WithMaxValue, WithLogger, WithObserver. A server that refuses the token, or that cannot
// prove it holds the client's token, yields an error wrapping
// ErrUnauthorized.
func Dial(ctx context.Context, addr string, opts ...Option) (Store, error) {
	s, err := dial(ctx, addr, newConfig(opts))
	if err != nil {
		return nil, err
	}
	return s, nil
}

func dial(ctx context.Context, addr string, cfg config) (*TCPStore, error) {
	var sid [8]byte
	rand.Read(sid[:])
	s := &TCPStore{
		cfg:       cfg,
		addr:      addr,
		session:   binary.LittleEndian.Uint64(sid[:]),
		dialing:   make(chan struct{}, 1),
		done:      make(chan struct{}),
		goneAfter: GoneAfter,
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}
	if _, err := s.conn(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// NewTCP returns a TCP store the way c10d's TCPStore does: with isServer the
// caller (rank 0) starts a server listening on addr (port 0 picks one; see
// Addr) and a client of it, which owns the server: Close stops both. Without
// isServer it dials the server at addr like Dial.
func NewTCP(ctx context.Context, addr string, isServer bool, opts ...Option) (*TCPStore, error) {
	cfg := newConfig(opts)
	if !isServer {
		return dial(ctx, addr, cfg)
	}
	srv, err := NewServer(addr, opts...)
	if err != nil {
		return nil, err
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(context.Background())
	}()
	s, err := dial(ctx, loopbackFor(srv.Addr()), cfg)
	if err != nil {
		srv.Close()
		<-served
		return nil, err
	}
	s.server, s.serveDone = srv, served
	return s, nil
}

// loopbackFor turns a listening address on every interface into one a local
// client can dial.
func loopbackFor(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			return net.JoinHostPort("127.0.0.1", port)
		}
		return net.JoinHostPort("::1", port)
	}
	return addr
}

// Addr returns the server's address: where the embedded server listens, or
// the address dialled.
func (s *TCPStore) Addr() string {
	if s.server != nil {
		return s.server.Addr()
	}
	return s.addr
}

// Close closes the connection, ends every call in flight with ErrClosed, and
// stops the embedded server if there is one. It returns once every goroutine
// of the store has ended.
func (s *TCPStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	cc := s.cur
	s.cur = nil
	s.mu.Unlock()
	if cc != nil {
		bye := message{op: opBye, id: s.nextID.Add(1)}
		cc.c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) // cuts short a write in progress
		cc.write(appendFrame(nil, &bye), time.Now().Add(100*time.Millisecond))
		cc.fail(ErrClosed)
	}
	s.wg.Wait()
	if s.server != nil {
		err := s.server.Close()
		<-s.serveDone
		return err
	}
	return nil
}

// clientConn is one connection to the server; a reader goroutine delivers
// replies to the requests waiting for them.
type clientConn struct {
	c   net.Conn
	wmu sync.Mutex

	mu      sync.Mutex
	pending map[uint64]chan message
	dead    chan struct{}
	err     error
}

func (cc *clientConn) isDead() bool {
	select {
	case <-cc.dead:
		return true
	default:
		return false
	}
}

func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return
	}
	cc.err = err
	cc.pending = nil
	close(cc.dead)
	cc.c.Close()
}

// register makes room for the reply to id; nil if the connection is dead.
func (cc *clientConn) register(id uint64) chan message {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return nil
	}
	ch := make(chan message, 1)
	cc.pending[id] = ch
	return ch
}

func (cc *clientConn) unregister(id uint64) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	delete(cc.pending, id)
}

// write sends one frame, giving up at dl (a server that stopped reading
// must not hold the caller past its deadline; the connection is then
// unusable and the caller fails it).
func (cc *clientConn) write(frame []byte, dl time.Time) error {
	cc.wmu.Lock()
	defer cc.wmu.Unlock()
	cc.c.SetWriteDeadline(dl)
	_, err := cc.c.Write(frame)
	return err
}

func (cc *clientConn) readLoop(s *TCPStore) {
	br := bufio.NewReaderSize(cc.c, 64<<10)
	for {
		p, err := readFrame(br, s.cfg.maxFrame)
		if err != nil {
			cc.fail(fmt.Errorf("store connection to %s: %w: %w", s.addr, err, ErrPeerLost))
			return
		}
		m, err := decodeMessage(p)
		if err == nil && m.op != opReply {
			err = fmt.Errorf("server sent operation %d: %w", m.op, errMalformed)
		}
		if err != nil {
			s.cfg.logger.Warn("store client: dropping connection: malformed reply", "addr", s.addr, "err", err)
			cc.fail(fmt.Errorf("store connection to %s: %w: %w", s.addr, err, ErrPeerLost))
			return
		}
		cc.mu.Lock()
		ch := cc.pending[m.id]
		delete(cc.pending, m.id)
		cc.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// liveConn returns the live connection if there is one (nil, nil if not).
func (s *TCPStore) liveConn() (*clientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, closedError("connect")
	}
	if s.cur != nil && !s.cur.isDead() {
		return s.cur, nil
	}
	return nil, nil
}

// conn returns the live connection, dialling a new one if there is none.
func (s *TCPStore) conn(ctx context.Context) (*clientConn, error) {
	if cc, err := s.liveConn(); cc != nil || err != nil {
		return cc, err
	}
	select {
	case s.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, s.dialError(ctx, ctx.Err())
	case <-s.done:
		return nil, closedError("connect")
	}
	defer func() { <-s.dialing }()
	if cc, err := s.liveConn(); cc != nil || err != nil {
		return cc, err
	}
	cc, err := s.redial(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cc.fail(ErrClosed)
		return nil, closedError("connect")
	}
	s.cur = cc
	s.connected = true
	s.refusedSince = time.Time{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		cc.readLoop(s)
	}()
	return cc, nil
}

func (s *TCPStore) dialError(ctx context.Context, last error) error {
	s.mu.Lock()
	lost := s.connected
	s.mu.Unlock()
	if lost {
		return errs.Wrap(ctx, fmt.Sprintf("store: connect: lost the connection to server %s and cannot reach it again; check that the server still runs", s.addr),
			fmt.Errorf("%w: %w", last, ErrPeerLost))
	}
	return errs.Wrap(ctx, fmt.Sprintf("store: connect: cannot reach server %s; check the address and that the server runs", s.addr), last)
}

// redial connects and says hello, retrying with backoff until ctx ends; it
// gives up at once if the server refuses the token or protocol, and after
// GoneAfter of refused connections once the client had been connected.
func (s *TCPStore) redial(ctx context.Context) (*clientConn, error) {
	backoff := 5 * time.Millisecond
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", s.addr)
		if gone := s.noteRefused(err); gone != nil {
			return nil, gone
		}
		if err == nil {
			var cc *clientConn
			cc, err = s.hello(ctx, c)
			if err == nil {
				return cc, nil
			}
			c.Close()
			if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrInvalidArgument) {
				return nil, err
			}
		}
		if ctx.Err() != nil {
			return nil, s.dialError(ctx, err)
		}
		select {
		case <-ctx.Done():
			return nil, s.dialError(ctx, err)
		case <-s.done:
			return nil, closedError("connect")
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// noteRefused keeps track of refused dials (err is a dial's outcome) and
// returns an error wrapping ErrPeerLost once a client that was connected has
// seen only refusals for goneAfter.
func (s *TCPStore) noteRefused(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		s.refusedSince = time.Time{}
		return nil
	}
	if !s.connected {
		return nil // the server may not be up yet
	}
	now := time.Now()
	if s.refusedSince.IsZero() {
		s.refusedSince = now
	}
	if now.Sub(s.refusedSince) < s.goneAfter {
		return nil
	}
	return fmt.Errorf("store: the server at %s is gone: connections refused since %s (%v); the process that served the store exited or closed it: %w",
		s.addr, s.refusedSince.Format("15:04:05.000"), now.Sub(s.refusedSince).Round(100*time.Millisecond), ErrPeerLost)
}

// hello runs the client's side of the handshake (see wire.go): it proves
// that it holds the token and makes the server prove it too, without either
// sending it.
func (s *TCPStore) hello(ctx context.Context, c net.Conn) (*clientConn, error) {
	dl := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	c.SetDeadline(dl)
	mine, err := tokenauth.NewNonce()
	if err != nil {
		return nil, fmt.Errorf("store: connecting to %s: %w", s.addr, err)
	}
	h := message{op: opHello, id: s.session, num: protoVersion, keys: []string{protoMagic, authScheme}, vals: [][]byte{mine[:]}}
	if _, err := c.Write(appendFrame(nil, &h)); err != nil {
		return nil, err
	}
	// The challenge: the server's nonce, or a refusal (another version).
	r, err := s.readHelloReply(c)
	if err != nil {
		return nil, err
	}
	if r.code == codeInvalid {
		return nil, fmt.Errorf("store: server %s refused the connection (this client speaks store protocol version %d): %w",
			s.addr, protoVersion, replyError(&r))
	}
	if r.code != codeOK {
		return nil, fmt.Errorf("store: server %s refused the connection: %w", s.addr, replyError(&r))
	}
	if len(r.vals) != 1 || len(r.vals[0]) != tokenauth.NonceSize || r.num < 0 || r.num > 1 {
		return nil, fmt.Errorf("store server %s answered hello with a malformed challenge; "+
			"is it a Tandem store of store protocol version %d?: %w", s.addr, protoVersion, ErrInvalidArgument)
	}
	theirs := tokenauth.Nonce(r.vals[0])
	serverHasToken := r.num == 1
	key := tokenauth.NewKey([]byte(s.cfg.token), protoMagic)
	if !key.Empty() && !serverHasToken {
		return nil, fmt.Errorf("store: server %s has no token but this client has one, so the server cannot prove "+
			"that it is the job's store; give the server the same token (WithToken or %s), or this client none: %w",
			s.addr, TokenEnv, ErrUnauthorized)
	}
	bind := helloBind(s.session, serverHasToken)
	proof := message{op: opHello, id: s.session, num: protoVersion}
	if !key.Empty() {
		mac := key.Prove(tokenauth.Dialer, mine, theirs, bind)
		proof.vals = [][]byte{mac[:]}
	}
	if _, err := c.Write(appendFrame(nil, &proof)); err != nil {
		return nil, err
	}
	// The verdict: the server's proof, or a refusal (the token).
	if r, err = s.readHelloReply(c); err != nil {
		return nil, err
	}
	if r.code != codeOK {
		return nil, fmt.Errorf("store: server %s refused the connection: %w", s.addr, replyError(&r))
	}
	if len(r.vals) != 1 || len(r.vals[0]) != tokenauth.MACSize ||
		!key.Verify(tokenauth.Acceptor, mine, theirs, tokenauth.MAC(r.vals[0]), bind) {
		return nil, fmt.Errorf("store: server %s could not prove that it holds this client's token; "+
			"give the client and the server the same token (WithToken or %s): %w", s.addr, TokenEnv, ErrUnauthorized)
	}
	c.SetDeadline(time.Time{})
	return &clientConn{c: c, pending: map[uint64]chan message{}, dead: make(chan struct{})}, nil
}

// readHelloReply reads one reply of the handshake.
func (s *TCPStore) readHelloReply(c net.Conn) (message, error) {
	p, err := readFrame(c, 64<<10)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("server closed the connection during the handshake: %w", err)
		}
		return message{}, err
	}
	r, err := decodeMessage(p)
	switch {
	case err != nil:
		return message{}, fmt.Errorf("store: connect: server %s answered hello with a malformed frame: %w: %w", s.addr, err, ErrInvalidArgument)
	case r.op != opReply:
		return message{}, fmt.Errorf("store: connect: server %s answered hello with operation %d, not a reply: %w", s.addr, r.op, ErrInvalidArgument)
	}
	return r, nil
}

// remoteError is an error reported by the server: its text, and the sentinel
// its status code names.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

func replyError(r *message) error {
	var sentinel error
	switch r.code {
	case codeOK:
		return nil
	case codeTimeout:
		sentinel = ErrTimeout
	case codeClosed:
		sentinel = ErrClosed
	case codeTooLarge:
		sentinel = ErrTooLarge
	case codeInvalid:
		sentinel = ErrInvalidArgument
	case codeUnauthorized:
		sentinel = ErrUnauthorized
	default:
		sentinel = errors.New("store server error")
	}
	msg := sentinel.Error()
	if len(r.vals) > 0 {
		msg = string(r.vals[0])
	}
	return &remoteError{msg: msg, sentinel: sentinel}
}

// request describes one call for do.
type request struct {
	op       string // for messages
	label    string // for the observer: op with underscores
	m        message
	blocking bool          // Get, MultiGet, Wait: m.num carries the timeout
	wait     time.Duration // Wait's own timeout; 0 for the store's default
	once     bool          // a write: the server applies it at most once
}

// do sends a request and returns the server's reply (see send), and
// reports the call to the observer, if there is one.
func (s *TCPStore) do(ctx context.Context, rq *request) (message, error) {
	o := s.cfg.observer
	if o == nil {
		return s.send(ctx, rq)
	}
	start := time.Now()
	r, err := s.send(ctx, rq)
	o.StoreOp(rq.label, time.Since(start), err)
	return r, err
}

// send sends a request and returns the server's reply, reconnecting and
// sending it again (same id, so the server can recognise a repeat) when the
// connection breaks.
func (s *TCPStore) send(ctx context.Context, rq *request) (message, error) {
	if err := enter(ctx, rq.op); err != nil {
		return message{}, err
	}
	dl, ctxBound := deadline(ctx, rq.wait, s.cfg.timeout)
	timeout := rq.wait
	if timeout <= 0 {
		timeout = s.cfg.timeout
	}
	timedOut := func() error {
		if rq.blocking {
			return waitError(ctx, rq.op, rq.m.keys, timeout, ctxBound)
		}
		return ctxErrorOr(ctx, rq.op, timeout)
	}
	rq.m.id = s.nextID.Add(1)
	if rq.once {
		rq.m.code = flagOnce
	}
	if rq.blocking {
		rq.m.num = max(time.Until(dl).Milliseconds(), 1)
	}
	if len(rq.m.keys) > maxList {
		return message{}, fmt.Errorf("store %s names %d keys; at most %d fit in one request: %w", rq.op, len(rq.m.keys), maxList, ErrTooLarge)
	}
	frame := appendFrame(nil, &rq.m)
	// Room for a larger timeout when a blocking request is encoded again.
	if size := len(frame) - frameHeader + binary.MaxVarintLen64; size > s.cfg.maxFrame {
		return message{}, fmt.Errorf("store %s request of %d bytes exceeds the frame limit of %d bytes (WithMaxFrame): %w",
			rq.op, size, s.cfg.maxFrame, ErrTooLarge)
	}
	// Waiting for an answer goes on a little past the deadline, since the
	// server answers a blocked request at the deadline; reconnecting stops at it.
	timer := time.NewTimer(time.Until(dl) + replyGrace)
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			// The connection broke with this request in flight. Pause a little
			// (more each time) so a server that keeps dropping us is not hammered.
			pause := time.NewTimer(min(time.Millisecond<<min(attempt, 10), time.Second, time.Until(dl)))
			select {
			case <-pause.C:
			case <-ctx.Done():
				pause.Stop()
				return message{}, timedOut()
			case <-s.done:
				pause.Stop()
				return message{}, closedError(rq.op)
			}
			if !time.Now().Before(dl) {
				return message{}, fmt.Errorf("%w (the connection to %s broke and no new one came up in time: %w)", timedOut(), s.addr, ErrPeerLost)
			}
			if rq.blocking {
				rq.m.num = max(time.Until(dl).Milliseconds(), 1)
				frame = appendFrame(frame[:0], &rq.m)
			}
		}
		cc, err := s.liveConn()
		if cc == nil && err == nil {
			dctx, cancel := context.WithDeadline(ctx, dl)
			cc, err = s.conn(dctx)
			expired := dctx.Err() != nil && ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded)
			cancel()
			if err != nil && expired {
				return message{}, fmt.Errorf("%w (%w)", timedOut(), err)
			}
		}
		if err != nil {
			return message{}, err
		}
		ch := cc.register(rq.m.id)
		if ch == nil {
			continue
		}
		if err := cc.write(frame, dl.Add(replyGrace)); err != nil {
			cc.fail(fmt.Errorf("store connection to %s: %w: %w", s.addr, err, ErrPeerLost))
			s.cfg.logger.Info("store client: connection lost; reconnecting", "addr", s.addr, "op", rq.op, "err", err)
			continue
		}
		select {
		case r := <-ch:
			if r.code == codeTimeout && rq.blocking {
				return message{}, timedOut()
			}
			if err := replyError(&r); err != nil {
				return message{}, fmt.Errorf("store %s: %w", rq.op, err)
			}
			return r, nil
		case <-cc.dead:
			s.cfg.logger.Info("store client: connection lost; reconnecting", "addr", s.addr, "op", rq.op, "err", cc.err)
			continue
		case <-ctx.Done():
		case <-timer.C:
		case <-s.done:
			return message{}, closedError(rq.op)
		}
		// Gave up waiting: tell the server to drop a blocked request.
		cc.unregister(rq.m.id)
		if rq.blocking {
			cancelReq := message{op: opCancel, num: int64(rq.m.id)}
			cc.write(appendFrame(nil, &cancelReq), time.Now().Add(time.Second))
		}
		return message{}, timedOut()
	}
}

// ctxErrorOr reports a non-blocking call that ran out of time.
func ctxErrorOr(ctx context.Context, op string, timeout time.Duration) error {
	if ctx.Err() != nil {
		return ctxError(ctx, op)
	}
	return fmt.Errorf("store: %s: got no answer within %v: %w", op, timeout, ErrTimeout)
}

// Set implements Store.
func (s *TCPStore) Set(ctx context.Context, key string, value []byte) error {
	if err := s.checkValue("set", len(value)); err != nil {
		return err
	}
	_, err := s.do(ctx, &request{op: "set", label: "set", once: true,
		m: message{op: opSet, keys: []string{key}, vals: [][]byte{value}}})
	return err
}

// Get implements Store.
func (s *TCPStore) Get(ctx context.Context, key string) ([]byte, error) {
	r, err := s.do(ctx, &request{op: "get", label: "get", blocking: true,
		m: message{op: opGet, keys: []string{key}}})
	if err != nil {
		return nil, err
	}
	if len(r.vals) != 1 {
		return nil, s.badReply("get", &r)
	}
	return r.vals[0], nil
}

// Add implements Store. After a reconnect it is applied at most once; see
// TCPStore.
func (s *TCPStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	r, err := s.do(ctx, &request{op: "add", label: "add", once: true,
		m: message{op: opAdd, keys: []string{key}, num: delta}})
	return r.num, err
}

// CompareSet implements Store. After a reconnect it is applied at most once;
// see TCPStore.
func (s *TCPStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := s.checkValue("compare-set", len(desired)); err != nil {
		return nil, err
	}
	r, err := s.do(ctx, &request{op: "compare-set", label: "compare_set", once: true,
		m: message{op: opCompareSet, keys: []string{key}, vals: [][]byte{expected, desired}}})
	if err != nil {
		return nil, err
	}
	if len(r.vals) != 1 {
		return nil, s.badReply("compare-set", &r)
	}
	return r.vals[0], nil
}

// DeleteKey implements Store.
func (s *TCPStore) DeleteKey(ctx context.Context, key string) (bool, error) {
	r, err := s.do(ctx, &request{op: "delete-key", label: "delete_key", once: true,
		m: message{op: opDeleteKey, keys: []string{key}}})
	return r.num != 0, err
}

// NumKeys implements Store.
func (s *TCPStore) NumKeys(ctx context.Context) (int64, error) {
	r, err := s.do(ctx, &request{op: "num-keys", label: "num_keys", m: message{op: opNumKeys}})
	return r.num, err
}

// Check implements Store.
func (s *TCPStore) Check(ctx context.Context, keys []string) (bool, error) {
	r, err := s.do(ctx, &request{op: "check", label: "check", m: message{op: opCheck, keys: keys}})
	return r.num != 0, err
}

// Wait implements Store.
func (s *TCPStore) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	_, err := s.do(ctx, &request{op: "wait", label: "wait", blocking: true, wait: timeout,
		m: message{op: opWait, keys: keys}})
	return err
}

// MultiSet implements Store.
func (s *TCPStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if err := checkMulti("multi-set", keys, values); err != nil {
		return err
	}
	n := 0
	for _, v := range values {
		n += len(v)
	}
	if err := s.checkValue("multi-set", n); err != nil {
		return err
	}
	_, err := s.do(ctx, &request{op: "multi-set", label: "multi_set", once: true,
		m: message{op: opMultiSet, keys: keys, vals: values}})
	return err
}

// MultiGet implements Store.
func (s *TCPStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	r, err := s.do(ctx, &request{op: "multi-get", label: "multi_get", blocking: true,
		m: message{op: opMultiGet, keys: keys}})
	if err != nil {
		return nil, err
	}
	if len(r.vals) != len(keys) {
		return nil, s.badReply("multi-get", &r)
	}
	return r.vals, nil
}

// Append implements Store. After a reconnect it is applied at most once; see
// TCPStore.
func (s *TCPStore) Append(ctx context.Context, key string, value []byte) error {
	if err := s.checkValue("append", len(value)); err != nil {
		return err
	}
	_, err := s.do(ctx, &request{op: "append", label: "append", once: true,
		m: message{op: opAppend, keys: []string{key}, vals: [][]byte{value}}})
	return err
}

func (s *TCPStore) checkValue(op string, n int) error {
	if n > s.cfg.maxValue {
		return fmt.Errorf("store %s of %d bytes exceeds the value limit of %d bytes (WithMaxValue): %w", op, n, s.cfg.maxValue, ErrTooLarge)
	}
	return nil
}

func (s *TCPStore) badReply(op string, r *message) error {
	return fmt.Errorf("store %s: server %s answered with %d values: %w", op, s.addr, len(r.vals), ErrInvalidArgument)
}
