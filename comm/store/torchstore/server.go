package torchstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/errs"
)

// Bounds on what one connection may leave pending at the server.
const (
	// maxWaitsPerConn bounds the WAIT queries of one connection that are not
	// answered yet. A torch client has one (and one more left behind by
	// each wait that timed out on its side).
	maxWaitsPerConn = 1024
	// maxWatchesPerConn bounds the WATCH_KEY registrations of one connection.
	maxWatchesPerConn = 4096
)

// Server serves the key-value store over torch 1.13's TCPStore protocol, so
// that PyTorch processes (torch.distributed.TCPStore(host, port, world_size,
// is_master=False)) and Go clients (Dial) share its keys.
//
// The protocol has no authentication: whoever reaches the address can read,
// write and delete every key. NewServer therefore demands the Unauthenticated
// option, and listens on loopback unless it is given a host.
//
// Each connection is read by one goroutine, one query after another, as
// torch's server does; a WAIT whose keys are missing is parked on the keys'
// waiter lists (nothing polls) and answered with STOP_WAITING when the last
// one is set, while later queries of the same connection are served.
type Server struct {
	cfg  config
	log  *slog.Logger
	warn *admit.Warner
	// gate counts every open connection, in all and per remote host (the
	// protocol has no handshake, so admit's caps apply to the whole life of
	// a connection here).
	gate *admit.Gate
	ln   net.Listener
	lim  limits

	conns admit.Conns[*serverConn]

	mu       sync.Mutex // guards data, waiting, watching and closed
	data     map[string][]byte
	waiting  map[string][]*waiter
	watching map[string][]*serverConn
	closed   bool
	serving  bool
	done     chan struct{}
	wg       sync.WaitGroup
}

// waiter is one parked WAIT.
type waiter struct {
	sc      *serverConn
	keys    []string
	missing int
	size    int // bytes of keys, counted against the connection
}

// NewServer listens on addr and returns a server that answers clients once
// Serve runs. An addr without a host (":29500", or "" for a free port)
// listens on loopback only; name a host ("0.0.0.0:29500") to be reachable
// from other machines. Port 0 picks a free port (see Addr).
//
// The Unauthenticated option is required: without it NewServer returns an
// error wrapping store.ErrInvalidArgument. Other options: WithMaxValue,
// WithMaxConns, WithQueryTimeout, WithLogger.
func NewServer(addr string, opts ...Option) (*Server, error) {
	cfg := newConfig(opts)
	if !cfg.unauthenticate {
		return nil, fmt.Errorf("torchstore server: PyTorch's TCPStore protocol has no authentication "+
			"(anyone who reaches %q can read and change every key); pass torchstore.Unauthenticated() "+
			"to serve it anyway, or use store.NewServer, which checks a token: %w", addr, store.ErrInvalidArgument)
	}
	host, port, err := net.SplitHostPort(addr)
	if addr == "" {
		host, port, err = "", "0", nil
	}
	if err != nil {
		return nil, fmt.Errorf("torchstore server: address %q: %v; give host:port, or :port for loopback: %w",
			addr, err, store.ErrInvalidArgument)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, fmt.Errorf("torchstore server: listen on %s: %w; pick another port or stop what holds it",
			net.JoinHostPort(host, port), err)
	}
	return &Server{
		cfg:      cfg,
		log:      cfg.logger,
		warn:     admit.NewWarner(cfg.logger, 0),
		gate:     admit.NewGate(cfg.maxConns, cfg.maxPerHost),
		ln:       ln,
		lim:      limits{maxValue: cfg.maxValue},
		data:     map[string][]byte{},
		waiting:  map[string][]*waiter{},
		watching: map[string][]*serverConn{},
		done:     make(chan struct{}),
	}, nil
}

// Addr returns the address the server listens on, with the port it bound.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Port returns the port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Serve accepts and serves clients until ctx ends or Close is called, then
// closes the server and returns nil once every connection is gone. It
// returns an error wrapping store.ErrClosed when the server was closed
// before, or is serving already.
func (s *Server) Serve(ctx context.Context) error {
	if err := errs.CheckContext(ctx, "torchstore server", "serve"); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed || s.serving {
		s.mu.Unlock()
		return fmt.Errorf("torchstore server: Serve called twice or after Close: %w", store.ErrClosed)
	}
	s.serving = true
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	admit.Accept(s.ln, s.done, s.warn, "torchstore server", s.start)
	return s.Close()
}

// Close stops the server: the listener and every connection are closed and
// every parked WAIT is dropped. It waits until the connections' goroutines
// have ended. Calling it again does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	first := !s.closed
	if first {
		s.closed = true
		close(s.done)
		s.ln.Close()
	}
	s.mu.Unlock()
	if first {
		for _, sc := range s.conns.Close() {
			sc.close()
		}
	}
	s.conns.Wait()
	s.wg.Wait()
	return nil
}

// NumConns returns the number of connections open now.
func (s *Server) NumConns() int {
	return s.conns.Len()
}

func (s *Server) start(c net.Conn) {
	release, ok := s.gate.Admit(c.RemoteAddr())
	if !ok {
		c.Close()
		s.warn.Warn("torchstore server: refused a connection over the limit of open connections; "+
			"raise it with WithMaxConns if this many clients are expected",
			"remote", c.RemoteAddr().String(), "max", s.cfg.maxConns, "max_per_host", s.cfg.maxPerHost,
			"refused_total", s.gate.Refused())
		return
	}
	sc := &serverConn{
		s:      s,
		c:      c,
		remote: c.RemoteAddr().String(),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	served := s.conns.Serve(sc, func() {
		defer release()
		sc.readLoop()
		s.forget(sc)
	})
	if !served {
		release()
		c.Close()
	}
}

// forget drops what the server holds for a connection that ended.
func (s *Server) forget(sc *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range sc.waits {
		for _, k := range w.keys {
			s.waiting[k] = removeWaiter(s.waiting[k], w)
			if len(s.waiting[k]) == 0 {
				delete(s.waiting, k)
			}
		}
	}
	sc.waits = nil
	for _, k := range sc.watches {
		s.watching[k] = removeConn(s.watching[k], sc)
		if len(s.watching[k]) == 0 {
			delete(s.watching, k)
		}
	}
	sc.watches = nil
}

func removeWaiter(ws []*waiter, w *waiter) []*waiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

func removeConn(cs []*serverConn, sc *serverConn) []*serverConn {
	for i, x := range cs {
		if x == sc {
			return append(cs[:i], cs[i+1:]...)
		}
	}
	return cs
}

// serverConn is one client connection. Its replies, and the STOP_WAITING
// and watch notifications that other connections' writes cause, are queued
// in out (under the server's mutex, so that they leave in the order the
// store changed) and written by writeLoop.
type serverConn struct {
	s      *Server
	c      net.Conn
	remote string

	// Guarded by s.mu.
	waits     []*waiter
	waitBytes int
	watches   []string

	outMu   sync.Mutex
	out     []byte
	closed  bool
	writing bool // writeLoop runs
	wake    chan struct{}
	done    chan struct{}
}

// send queues b for the client. A client that lets more than a value's
// worth of replies pile up unread is disconnected.
//
// The writer goroutine starts with the first reply, so that a connection
// that never asks anything (torch's second one) costs one goroutine. Its
// wg.Add cannot race with Server.Close's Wait reaching zero: the reader
// goroutine still counts, since it marks the connection closed before it
// ends.
func (sc *serverConn) send(b []byte) {
	sc.outMu.Lock()
	if sc.closed {
		sc.outMu.Unlock()
		return
	}
	if !sc.writing {
		sc.writing = true
		sc.s.wg.Add(1)
		go func() {
			defer sc.s.wg.Done()
			sc.writeLoop()
		}()
	}
	if len(sc.out)+len(b) > sc.s.cfg.maxValue+readChunk {
		sc.outMu.Unlock()
		sc.drop("it leaves replies unread")
		return
	}
	sc.out = append(sc.out, b...)
	sc.outMu.Unlock()
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

func (sc *serverConn) writeLoop() {
	var buf []byte
	for {
		select {
		case <-sc.wake:
		case <-sc.done:
			return
		}
		sc.outMu.Lock()
		buf, sc.out = sc.out, buf[:0]
		sc.outMu.Unlock()
		if len(buf) == 0 {
			continue
		}
		sc.c.SetWriteDeadline(time.Now().Add(sc.s.cfg.queryTimeout))
		if _, err := sc.c.Write(buf); err != nil {
			sc.dropErr("writing a reply failed", err)
			return
		}
	}
}

// close ends the connection; it is safe to call more than once and from any
// goroutine.
func (sc *serverConn) close() {
	sc.outMu.Lock()
	if sc.closed {
		sc.outMu.Unlock()
		return
	}
	sc.closed = true
	sc.out = nil
	close(sc.done)
	sc.outMu.Unlock()
	sc.c.Close()
}

// drop closes the connection and logs why (at most once per interval).
func (sc *serverConn) drop(why string) {
	sc.dropErr(why, nil)
}

func (sc *serverConn) dropErr(why string, err error) {
	sc.outMu.Lock()
	was := sc.closed
	sc.outMu.Unlock()
	if was {
		return
	}
	sc.close()
	args := []any{"remote", sc.remote}
	if err != nil {
		args = append(args, "err", err)
	}
	sc.s.warn.Warn("torchstore server: closing a connection: "+why, args...)
}

func (sc *serverConn) readLoop() {
	defer sc.close()
	r := bufio.NewReaderSize(sc.c, admit.HelloBuffer)
	first := true
	for {
		// Wait as long as it takes for a query to start: torch clients keep
		// connections open and silent between calls.
		sc.c.SetReadDeadline(time.Time{})
		if _, err := r.Peek(1); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				sc.dropErr("reading failed", err)
			}
			return
		}
		sc.c.SetReadDeadline(time.Now().Add(sc.s.cfg.queryTimeout))
		q, err := decodeQuery(r, sc.s.lim, first)
		if err != nil {
			switch {
			case errors.Is(err, net.ErrClosed):
			case errors.Is(err, errNewerClient):
				sc.dropErr("protocol version mismatch", err)
			case errors.Is(err, errTooLarge):
				sc.dropErr("a query over the size limit (raise it with WithMaxValue)", err)
			case errors.Is(err, io.ErrUnexpectedEOF):
				sc.drop("the peer closed in the middle of a query")
			case isTimeout(err):
				sc.dropErr("a query did not arrive in full in time (see WithQueryTimeout)", err)
			default:
				sc.dropErr("malformed query", err)
			}
			return
		}
		first = false
		if why := sc.s.apply(sc, q); why != "" {
			sc.drop(why)
			return
		}
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// apply runs one query. A query that torch's server answers by closing the
// connection (the protocol has no error reply) returns why.
func (s *Server) apply(sc *serverConn, q query) (why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ""
	}
	switch q.typ {
	case qSet:
		s.put(q.key, q.value)
	case qCompareSet:
		cur, ok := s.data[q.key]
		switch {
		case !ok && len(q.value) == 0:
			s.put(q.key, q.desired)
			sc.send(appendBytes(nil, q.desired))
		case !ok:
			// torch answers with the expected value when the key is absent.
			sc.send(appendBytes(nil, q.value))
		case string(cur) == string(q.value):
			s.put(q.key, q.desired)
			sc.send(appendBytes(nil, q.desired))
		default:
			sc.send(appendBytes(nil, cur))
		}
	case qGet:
		v, ok := s.data[q.key]
		if !ok {
			return fmt.Sprintf("GET of missing key %q (torch clients WAIT for a key before they GET it)", q.key)
		}
		sc.send(appendBytes(nil, v))
	case qAdd:
		n := q.delta
		if v, ok := s.data[q.key]; ok {
			cur, ok := parseCounter(v)
			if !ok || (n > 0 && cur > maxInt64-n) || (n < 0 && cur < minInt64-n) {
				return fmt.Sprintf("ADD %d to key %q, which holds %q, not an integer counter that can take it", n, q.key, abbrev(v))
			}
			n += cur
		}
		sc.send(appendUint64(nil, uint64(n)))
		s.put(q.key, []byte(strconv.FormatInt(n, 10)))
	case qCheck:
		if s.has(q.keys) {
			sc.send([]byte{checkReady})
		} else {
			sc.send([]byte{checkNotReady})
		}
	case qWait:
		return s.park(sc, q.keys)
	case qNumKeys:
		sc.send(appendUint64(nil, uint64(len(s.data))))
	case qWatchKey:
		if len(sc.watches) >= maxWatchesPerConn {
			return fmt.Sprintf("more than %d WATCH_KEY registrations on one connection", maxWatchesPerConn)
		}
		sc.watches = append(sc.watches, q.key)
		s.watching[q.key] = append(s.watching[q.key], sc)
		sc.send([]byte{watchRegistered})
	case qDeleteKey:
		old, ok := s.data[q.key]
		if ok {
			delete(s.data, q.key)
			s.notify(q.key, watchDeleted, old, nil)
			sc.send(appendUint64(nil, 1))
		} else {
			sc.send(appendUint64(nil, 0))
		}
	}
	return ""
}

const (
	maxInt64 = 1<<63 - 1
	minInt64 = -1 << 63
)

// put stores value under key, answers the WAITs it completes and tells the
// key's watchers. Called with s.mu held.
func (s *Server) put(key string, value []byte) {
	old, existed := s.data[key]
	s.data[key] = value
	if !existed {
		for _, w := range s.waiting[key] {
			w.missing--
			if w.missing == 0 {
				w.sc.finish(w)
				w.sc.send([]byte{stopWaiting})
			}
		}
		delete(s.waiting, key)
		s.notify(key, watchCreated, nil, value)
	} else {
		s.notify(key, watchUpdated, old, value)
	}
}

// finish forgets an answered WAIT. Called with s.mu held.
func (sc *serverConn) finish(w *waiter) {
	for i, x := range sc.waits {
		if x == w {
			sc.waits = append(sc.waits[:i], sc.waits[i+1:]...)
			break
		}
	}
	sc.waitBytes -= w.size
}

// notify sends a watch notification to the connections watching key. Called
// with s.mu held.
func (s *Server) notify(key string, kind byte, old, value []byte) {
	ws := s.watching[key]
	if len(ws) == 0 {
		return
	}
	b := []byte{kind}
	b = appendString(b, key)
	b = appendBytes(b, old)
	b = appendBytes(b, value)
	for _, sc := range ws {
		sc.send(b)
	}
}

// has reports whether every key exists. Called with s.mu held.
func (s *Server) has(keys []string) bool {
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			return false
		}
	}
	return true
}

// park answers a WAIT at once when its keys exist, and otherwise parks it
// until they do. Called with s.mu held.
func (s *Server) park(sc *serverConn, keys []string) (why string) {
	w := &waiter{sc: sc}
	seen := map[string]bool{}
	for _, k := range keys {
		if _, ok := s.data[k]; ok || seen[k] {
			continue
		}
		seen[k] = true
		w.keys = append(w.keys, k)
		w.size += len(k) + 8
	}
	if len(w.keys) == 0 {
		sc.send([]byte{stopWaiting})
		return ""
	}
	if len(sc.waits) >= maxWaitsPerConn || sc.waitBytes+w.size > s.cfg.maxValue {
		return fmt.Sprintf("more than %d unanswered WAIT queries, or %d bytes of their keys, on one connection",
			maxWaitsPerConn, s.cfg.maxValue)
	}
	w.missing = len(w.keys)
	sc.waits = append(sc.waits, w)
	sc.waitBytes += w.size
	for _, k := range w.keys {
		s.waiting[k] = append(s.waiting[k], w)
	}
	return ""
}

// abbrev shortens a value for a log line.
func abbrev(v []byte) string {
	const n = 64
	if len(v) <= n {
		return string(v)
	}
	return string(v[:n]) + "..."
}
