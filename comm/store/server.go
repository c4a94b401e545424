package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// handshakeTimeout bounds how long a new connection may take to say hello.
const handshakeTimeout = admit.HandshakeTimeout

// maxHello bounds a frame of the handshake (a hello of store protocol
// version 1 carried the token, of any length; version 2's are under 100 bytes).
const maxHello = 64 << 10

// connBuffer is the read and write buffer of an authenticated connection.
const connBuffer = 64 << 10

// outHighWater is how many bytes of replies may queue for a slow client
// before the server stops reading its requests.
const outHighWater = 16 << 20

// What a server remembers of a client session to answer repeated requests.
const (
	sessionReplies = 1024            // replies of flagOnce requests kept
	sessionBytes   = 4 << 20         // bytes of such replies kept
	sessionTTL     = 5 * time.Minute // how long a session outlives its connection
)

// Server is the server side of the TCP store (c10d's TCPStore master). It
// holds the keys in memory and answers any number of clients, each over one
// connection that carries many concurrent requests. Blocked Get, MultiGet and
// Wait requests wait on the key table's waiter lists: no goroutine is parked
// and nothing polls while they wait.
//
// Create one with NewServer, run it with Serve, stop it with Close (or by
// ending Serve's context). Clients connect with Dial; NewTCP embeds a server
// in rank 0.
//
// A connection costs the server little until its client has proved that it
// holds the token (see wire.go for the challenge-response): a 512-byte read
// buffer and one goroutine, for at most 5 seconds, the two round trips of
// the handshake included. At most WithMaxPending connections may be in that state at once
// (in all, and from one remote host); the server closes any other new
// connection at once, and a client turned away that way dials again.
// Warnings about connections that never authenticated (junk, wrong tokens,
// timeouts, connections over the cap) are rate-limited, each kind to one line
// per 10 seconds that counts the ones it left out, so that a flood of
// connections does not flood the log.
type Server struct {
	cfg  config
	log  *slog.Logger
	ln   net.Listener
	t    *table
	gate *admit.Gate
	warn warnings

	conns admit.Conns[*serverConn]

	mu       sync.Mutex
	sessions map[uint64]*session
	closed   bool
	serving  bool
	done     chan struct{}
	wg       sync.WaitGroup

	// loseReply, when set (by tests), is asked after each request ran whether
	// to drop the connection before its reply goes out.
	loseReply func(m *message) bool
}

// NewServer listens on addr (host:port; port 0 picks a free port, see Addr)
// and returns a server that answers clients once Serve runs. Options:
// WithToken (clients must prove they hold it; default from TANDEM_TOKEN),
// WithTimeout (the default bound of blocking requests that name none),
// WithMaxFrame, WithMaxValue, WithMaxPending, WithLogger.
func NewServer(addr string, opts ...Option) (*Server, error) {
	cfg := newConfig(opts)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store server: listen on %q: %w", addr, err)
	}
	return &Server{
		cfg:      cfg,
		log:      cfg.logger,
		ln:       ln,
		t:        newTable(),
		gate:     admit.NewGate(cfg.maxPending, cfg.maxPendingPerHost),
		warn:     newWarnings(cfg.logger),
		sessions: map[uint64]*session{},
		done:     make(chan struct{}),
	}, nil
}

// Addr returns the address the server listens on, with the port it bound.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve accepts and serves clients until ctx ends or Close is called, then
// closes the server and returns nil once every connection is gone. It returns
// an error wrapping ErrClosed if the server was already closed or is already
// serving.
func (s *Server) Serve(ctx context.Context) error {
	if err := errs.CheckContext(ctx, "store server", "serve"); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed || s.serving {
		s.mu.Unlock()
		return fmt.Errorf("store server: Serve called twice or after Close: %w", ErrClosed)
	}
	s.serving = true
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	admit.Accept(s.ln, s.done, s.warn.accept, "store server", func(c net.Conn) {
		admitted, ok := s.gate.Admit(c.RemoteAddr())
		if !ok {
			refuseBusy(c)
			s.warn.busy.Warn("store server: refusing connection: too many connections are saying hello; "+
				"the client will dial again (raise WithMaxPending if legitimate clients are turned away)",
				"remote", c.RemoteAddr())
			return
		}
		s.startConn(c, admitted)
	})
	return s.Close() // waits until every connection is gone
}

// refuseBusy closes a connection over the handshake cap at once, with a reset
// so that the server keeps no socket in TIME_WAIT for it.
func refuseBusy(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// warnings are the rate-limited warnings about connections that have not
// authenticated, one Warner per kind so that one kind cannot hide another.
type warnings struct {
	accept, busy, hello, version, wrongToken, missingToken *admit.Warner
}

func newWarnings(log *slog.Logger) warnings {
	w := func() *admit.Warner { return admit.NewWarner(log, 0) }
	return warnings{accept: w(), busy: w(), hello: w(), version: w(), wrongToken: w(), missingToken: w()}
}

// startConn serves c; admitted frees c's handshake slot in the gate.
func (s *Server) startConn(c net.Conn, admitted func()) {
	sc := &serverConn{
		s:          s,
		c:          c,
		remote:     c.RemoteAddr().String(),
		wake:       make(chan struct{}, 1),
		pending:    map[uint64]*pendingWait{},
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	sc.cond = sync.NewCond(&sc.mu)
	if !s.conns.Serve(sc, func() { sc.readLoop(admitted) }) {
		admitted()
		c.Close()
	}
}

func (s *Server) forget(sc *serverConn) {
	s.mu.Lock()
	if ses := sc.ses; ses != nil && ses.conn == sc {
		ses.conn = nil
		ses.idle = time.Now()
	}
	s.mu.Unlock()
}

// session is what the server knows of one client across its reconnects:
// the replies of its recent flagOnce requests.
type session struct {
	id   uint64
	conn *serverConn // the live connection, or nil since idle
	idle time.Time

	mu      sync.Mutex
	replies map[uint64][]byte // request id -> encoded reply frame
	order   []uint64
	bytes   int
}

// attach makes sc the connection of session id. An older connection of the
// same session is dropped first, and attach waits until it has stopped
// running requests, so that a request repeated on sc cannot overtake its
// first copy still queued on the old connection.
func (s *Server) attach(sc *serverConn, id uint64) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	now := time.Now()
	for sid, ses := range s.sessions {
		if ses.conn == nil && now.Sub(ses.idle) > sessionTTL {
			delete(s.sessions, sid)
		}
	}
	ses := s.sessions[id]
	if ses == nil {
		ses = &session{id: id, replies: map[uint64][]byte{}}
		s.sessions[id] = ses
	}
	old := ses.conn
	ses.conn = sc
	sc.ses = ses
	s.mu.Unlock()
	if old != nil {
		s.log.Info("store server: client reconnected; dropping its previous connection", "remote", sc.remote, "previous", old.remote)
		old.close()
		<-old.readerDone
	}
	return true
}

// endSession forgets sc's session when its client says goodbye.
func (s *Server) endSession(sc *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ses := sc.ses; ses != nil && ses.conn == sc {
		delete(s.sessions, ses.id)
	}
}

func (ses *session) lookup(id uint64) ([]byte, bool) {
	ses.mu.Lock()
	defer ses.mu.Unlock()
	f, ok := ses.replies[id]
	return f, ok
}

func (ses *session) remember(id uint64, frame []byte) {
	if len(frame) > sessionBytes/4 {
		r := errReply(id, errors.New("store server: the request was applied, but its reply was too large to "+
			"remember across the reconnect; read the key again"))
		frame = appendFrame(nil, &r)
	}
	ses.mu.Lock()
	defer ses.mu.Unlock()
	if _, dup := ses.replies[id]; dup {
		return
	}
	ses.replies[id] = frame
	ses.order = append(ses.order, id)
	ses.bytes += len(frame)
	for len(ses.order) > sessionReplies || ses.bytes > sessionBytes {
		old := ses.order[0]
		ses.order = ses.order[1:]
		ses.bytes -= len(ses.replies[old])
		delete(ses.replies, old)
	}
}

// Close stops accepting, drops every connection (blocked requests end),
// discards the keys and returns once every goroutine of the server is gone.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.conns.Wait()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	err := s.ln.Close()
	for _, sc := range s.conns.Close() {
		sc.close()
	}
	s.t.close()
	s.conns.Wait()
	s.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("store server: close listener: %w", err)
	}
	return nil
}

// dropConnections closes every client connection but keeps serving; tests
// use it to check that clients reconnect.
func (s *Server) dropConnections() {
	for _, sc := range s.conns.All() {
		sc.close()
	}
}

// serverConn is one client connection: a reader goroutine that decodes and
// runs requests, and a writer goroutine that sends queued replies.
type serverConn struct {
	s          *Server
	c          net.Conn
	remote     string
	ses        *session      // set by the handshake
	readerDone chan struct{} // closed when the reader has stopped running requests

	mu      sync.Mutex
	cond    *sync.Cond // signalled when queued shrinks or the conn closes
	out     [][]byte
	queued  int
	wake    chan struct{}
	pending map[uint64]*pendingWait
	closed  bool
	done    chan struct{}
}

func (sc *serverConn) drop(reason string, err error) {
	sc.s.log.Warn("store server: dropping connection", "remote", sc.remote, "reason", reason, "err", err)
	sc.close()
}

// readLoop says hello, then reads and runs requests until the connection
// ends. admitted is called once the handshake is over, either way.
func (sc *serverConn) readLoop(admitted func()) {
	defer close(sc.readerDone)
	defer sc.close()
	// Until the client has proved it holds the token, the connection gets a
	// small buffer; the full one wraps it afterwards, keeping whatever the
	// client sent behind its hello.
	small := bufio.NewReaderSize(sc.c, admit.HelloBuffer)
	sc.c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	ok := sc.handshake(small)
	admitted()
	if !ok {
		return
	}
	sc.c.SetReadDeadline(time.Time{})
	br := bufio.NewReaderSize(small, connBuffer)
	sc.s.wg.Add(1)
	go func() {
		defer sc.s.wg.Done()
		sc.writeLoop()
	}()
	for {
		sc.mu.Lock()
		for sc.queued > outHighWater && !sc.closed {
			sc.cond.Wait()
		}
		sc.mu.Unlock()
		p, err := readFrame(br, sc.s.cfg.maxFrame)
		if err != nil {
			if sc.isClosed() || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return
			}
			sc.drop("cannot read a frame", err)
			return
		}
		m, err := decodeMessage(p)
		if err == nil {
			err = checkRequest(&m)
		}
		if err != nil {
			sc.drop("malformed request", err)
			return
		}
		if sc.isClosed() {
			return // frames buffered before a drop must not run
		}
		if !sc.handle(&m) {
			return
		}
	}
}

// handshake runs the server's side of the handshake (see wire.go): it
// challenges the client to prove that it holds the token, then proves it in
// turn; it reports whether the connection may go on. Every frame it reads
// goes through br, the small buffer, and grows only as its bytes arrive.
func (sc *serverConn) handshake(br *bufio.Reader) bool {
	noHello := func(err error) bool {
		sc.s.warn.hello.Warn("store server: dropping connection", "remote", sc.remote, "reason", "no valid hello", "err", err)
		sc.close()
		return false
	}
	read := func() (message, bool) {
		p, err := readFrameChunked(br, min(sc.s.cfg.maxFrame, maxHello), admit.HelloBuffer)
		if err != nil {
			if errors.Is(err, io.EOF) || isReset(err) {
				sc.close() // a client that gave up, or refused this server
				return message{}, false
			}
			return message{}, noHello(err)
		}
		m, err := decodeMessage(p)
		switch {
		case err != nil:
			return message{}, noHello(fmt.Errorf("not a store hello: %w: %w", err, errMalformed))
		case m.op != opHello:
			return message{}, noHello(fmt.Errorf("not a store hello (operation %d): %w", m.op, errMalformed))
		}
		return m, true
	}
	m, ok := read()
	if !ok {
		return false
	}
	if len(m.keys) != 2 || m.keys[0] != protoMagic {
		return noHello(fmt.Errorf("first frame is not a store hello: %w", errMalformed))
	}
	session := m.id
	refuse := func(w *admit.Warner, code byte, reason string) bool {
		w.Warn("store server: refusing connection", "remote", sc.remote, "reason", reason)
		reply := message{op: opReply, code: code, id: session, vals: [][]byte{[]byte("store server: " + reason)}}
		sc.c.SetWriteDeadline(time.Now().Add(time.Second))
		sc.c.Write(appendFrame(nil, &reply))
		sc.close()
		return false
	}
	// The version first: a client of another version gets an answer it can
	// read whatever else its hello holds.
	if m.num != protoVersion {
		return refuse(sc.s.warn.version, codeInvalid, fmt.Sprintf(
			"client speaks store protocol version %d, server version %d; run the same Tandem version on both", m.num, protoVersion))
	}
	if m.keys[1] != authScheme || len(m.vals) != 1 || len(m.vals[0]) != tokenauth.NonceSize {
		return noHello(fmt.Errorf("store hello without a challenge: %w", errMalformed))
	}
	theirs := tokenauth.Nonce(m.vals[0])
	mine, err := tokenauth.NewNonce()
	if err != nil {
		return refuse(sc.s.warn.hello, codeFailed, err.Error())
	}
	key := tokenauth.NewKey([]byte(sc.s.cfg.token), protoMagic)
	hasToken := int64(0)
	if !key.Empty() {
		hasToken = 1
	}
	send := func(r message) bool {
		sc.c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
		if _, err := sc.c.Write(appendFrame(nil, &r)); err != nil {
			sc.s.warn.hello.Warn("store server: dropping connection", "remote", sc.remote, "reason", "cannot answer hello", "err", err)
			sc.close()
			return false
		}
		sc.c.SetWriteDeadline(time.Time{})
		return true
	}
	if !send(message{op: opReply, code: codeOK, id: session, num: hasToken, vals: [][]byte{mine[:]}}) {
		return false
	}
	if m, ok = read(); !ok {
		return false
	}
	if m.id != session || m.num != protoVersion || len(m.keys) != 0 || len(m.vals) > 1 {
		return noHello(fmt.Errorf("the client's proof is not a store proof: %w", errMalformed))
	}
	bind := helloBind(session, !key.Empty())
	if !key.Empty() {
		if len(m.vals) == 0 {
			return refuse(sc.s.warn.missingToken, codeUnauthorized,
				"missing token: this server requires one; the client must use the server's token (WithToken or "+TokenEnv+")")
		}
		if len(m.vals[0]) != tokenauth.MACSize || !key.Verify(tokenauth.Dialer, theirs, mine, tokenauth.MAC(m.vals[0]), bind) {
			return refuse(sc.s.warn.wrongToken, codeUnauthorized,
				"wrong token: the client could not prove that it holds the server's token; the client must use the server's token (WithToken or "+TokenEnv+")")
		}
	}
	if !sc.s.attach(sc, session) {
		return false
	}
	verdict := key.Prove(tokenauth.Acceptor, theirs, mine, bind)
	return send(message{op: opReply, code: codeOK, id: session, vals: [][]byte{verdict[:]}})
}

func (sc *serverConn) writeLoop() {
	bw := bufio.NewWriterSize(sc.c, connBuffer)
	for {
		select {
		case <-sc.wake:
		case <-sc.done:
			return
		}
		sc.mu.Lock()
		batch := sc.out
		sc.out = nil
		sc.mu.Unlock()
		n := 0
		for _, f := range batch {
			n += len(f)
			if _, err := bw.Write(f); err != nil {
				sc.writeFailed(err)
				return
			}
		}
		if err := bw.Flush(); err != nil {
			sc.writeFailed(err)
			return
		}
		sc.mu.Lock()
		sc.queued -= n
		sc.cond.Broadcast()
		sc.mu.Unlock()
	}
}

func (sc *serverConn) writeFailed(err error) {
	if sc.isClosed() {
		return
	}
	sc.drop("cannot write a reply", err)
}

func (sc *serverConn) isClosed() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.closed
}

// encode makes m's frame, or an ErrTooLarge reply if m does not fit in one.
func (sc *serverConn) encode(m *message) []byte {
	f := appendFrame(nil, m)
	if len(f)-frameHeader > sc.s.cfg.maxFrame {
		tl := errReply(m.id, fmt.Errorf("the reply takes %d bytes, over the frame limit of %d; fetch fewer or smaller values: %w",
			len(f)-frameHeader, sc.s.cfg.maxFrame, ErrTooLarge))
		f = appendFrame(nil, &tl)
	}
	return f
}

// send queues a reply for the writer; it never blocks.
func (sc *serverConn) send(m *message) {
	sc.sendFrame(sc.encode(m))
}

func (sc *serverConn) sendFrame(f []byte) {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return
	}
	sc.out = append(sc.out, f)
	sc.queued += len(f)
	sc.mu.Unlock()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

func (sc *serverConn) close() {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return
	}
	sc.closed = true
	pending := sc.pending
	sc.pending = nil
	sc.out = nil
	close(sc.done)
	sc.cond.Broadcast()
	sc.mu.Unlock()
	sc.c.Close()
	for _, pw := range pending {
		pw.finish()
	}
	sc.s.forget(sc)
}

// isReset reports whether err says that the peer reset the connection,
// which a client that gave up on its hello does: not worth a warning.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}

// errReply turns an error into a reply with the matching status code.
func errReply(id uint64, err error) message {
	code := codeFailed
	switch {
	case errors.Is(err, ErrTimeout):
		code = codeTimeout
	case errors.Is(err, ErrClosed):
		code = codeClosed
	case errors.Is(err, ErrTooLarge):
		code = codeTooLarge
	case errors.Is(err, ErrInvalidArgument):
		code = codeInvalid
	case errors.Is(err, ErrUnauthorized):
		code = codeUnauthorized
	}
	return message{op: opReply, code: code, id: id, vals: [][]byte{[]byte(err.Error())}}
}

func (sc *serverConn) reply(m *message, err error) {
	if err != nil {
		r := errReply(m.id, err)
		sc.send(&r)
		return
	}
	sc.send(m)
}

func (sc *serverConn) tooLarge(op string, n int) error {
	if n <= sc.s.cfg.maxValue {
		return nil
	}
	return fmt.Errorf("store %s of %d bytes exceeds the value limit of %d bytes (WithMaxValue): %w", op, n, sc.s.cfg.maxValue, ErrTooLarge)
}

// handle runs one request; it reports false when the connection must end.
func (sc *serverConn) handle(m *message) bool {
	once := m.code&flagOnce != 0
	if once {
		if f, ok := sc.ses.lookup(m.id); ok {
			sc.sendFrame(f) // a repeat after a reconnect: answer, do not apply again
			return true
		}
	}
	t := sc.s.t
	r := message{op: opReply, id: m.id}
	var err error
	switch m.op {
	case opSet:
		if err = sc.tooLarge("set", len(m.vals[0])); err == nil {
			err = t.set(m.keys[0], m.vals[0])
		}
	case opAppend:
		if err = sc.tooLarge("append", len(m.vals[0])); err == nil {
			err = t.appendTo(m.keys[0], m.vals[0], sc.s.cfg.maxValue)
		}
	case opMultiSet:
		n := 0
		for _, v := range m.vals {
			n += len(v)
		}
		if err = sc.tooLarge("multi-set", n); err == nil {
			err = t.multiSet(m.keys, m.vals)
		}
	case opAdd:
		r.num, err = t.add(m.keys[0], m.num)
	case opCompareSet:
		var v []byte
		if err = sc.tooLarge("compare-set", len(m.vals[1])); err == nil {
			v, err = t.compareSet(m.keys[0], m.vals[0], m.vals[1])
			r.vals = [][]byte{v}
		}
	case opDeleteKey:
		var ok bool
		ok, err = t.deleteKey(m.keys[0])
		r.num = boolNum(ok)
	case opNumKeys:
		r.num, err = t.numKeys()
	case opCheck:
		var ok bool
		ok, err = t.check(m.keys)
		r.num = boolNum(ok)
	case opGet, opMultiGet, opWait:
		return sc.startWait(m)
	case opCancel:
		sc.mu.Lock()
		pw := sc.pending[uint64(m.num)]
		sc.mu.Unlock()
		if pw != nil {
			pw.finish()
		}
		return true
	case opBye:
		sc.s.endSession(sc)
		return true
	}
	if err != nil {
		r = errReply(m.id, err)
	}
	f := sc.encode(&r)
	if once {
		sc.ses.remember(m.id, f)
	}
	if sc.s.loseReply != nil && sc.s.loseReply(m) {
		sc.drop("test: reply lost on purpose", nil)
		return false
	}
	sc.sendFrame(f)
	return true
}

func boolNum(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// pendingWait is a blocked Get, MultiGet or Wait of one connection.
type pendingWait struct {
	sc      *serverConn
	id      uint64
	op      byte
	keys    []string
	timeout time.Duration

	mu       sync.Mutex
	finished bool
	w        *waiter
	timer    *time.Timer
}

func (sc *serverConn) startWait(m *message) bool {
	timeout := time.Duration(m.num) * time.Millisecond
	if timeout <= 0 {
		timeout = sc.s.cfg.timeout
	}
	pw := &pendingWait{sc: sc, id: m.id, op: m.op, keys: m.keys, timeout: timeout}
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return false
	}
	if sc.pending[m.id] != nil {
		sc.mu.Unlock()
		sc.drop("malformed request", fmt.Errorf("request id %d reused while still pending: %w", m.id, errMalformed))
		return false
	}
	sc.pending[m.id] = pw
	sc.mu.Unlock()
	pw.mu.Lock()
	pw.timer = time.AfterFunc(timeout, pw.expire)
	pw.mu.Unlock()
	pw.try()
	return true
}

// try answers the request if its keys exist, or (re)registers a waiter whose
// firing calls try again.
func (pw *pendingWait) try() {
	pw.mu.Lock()
	if pw.finished {
		pw.mu.Unlock()
		return
	}
	vals, w, err := pw.sc.s.t.getOrWait(pw.keys, pw.try)
	if err == nil && w != nil {
		pw.w = w
		pw.mu.Unlock()
		return
	}
	pw.done()
	pw.mu.Unlock()
	r := message{op: opReply, id: pw.id}
	if err == nil && pw.op != opWait {
		r.vals = vals
	}
	pw.sc.reply(&r, err)
}

// done marks pw finished, with pw.mu held.
func (pw *pendingWait) done() {
	pw.finished = true
	if pw.timer != nil {
		pw.timer.Stop()
	}
	if pw.w != nil {
		pw.sc.s.t.cancel(pw.w)
	}
	sc := pw.sc
	sc.mu.Lock()
	if sc.pending[pw.id] == pw {
		delete(sc.pending, pw.id)
	}
	sc.mu.Unlock()
}

func (pw *pendingWait) expire() {
	pw.mu.Lock()
	if pw.finished {
		pw.mu.Unlock()
		return
	}
	pw.done()
	pw.mu.Unlock()
	err := fmt.Errorf("store server: keys %q did not appear within %v: %w", pw.keys, pw.timeout, ErrTimeout)
	pw.sc.reply(&message{id: pw.id}, err)
}

// finish abandons pw without a reply (the client cancelled or left).
func (pw *pendingWait) finish() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if !pw.finished {
		pw.done()
	}
}
