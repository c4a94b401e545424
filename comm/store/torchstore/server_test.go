package torchstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/testlog"
)

// rawConn is a connection that speaks the protocol byte by byte.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func rawDial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) send(b []byte) {
	rc.t.Helper()
	rc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawConn) read(n int) []byte {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(rc.r, b); err != nil {
		rc.t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

func (rc *rawConn) readU64() uint64 { return binary.LittleEndian.Uint64(rc.read(8)) }

func (rc *rawConn) readBytes() string { return string(rc.read(int(rc.readU64()))) }

// quiet asserts that nothing arrives for d.
func (rc *rawConn) quiet(d time.Duration) {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(d))
	if b, err := rc.r.ReadByte(); err == nil {
		rc.t.Fatalf("unexpected byte %d", b)
	} else if !isTimeout(err) {
		rc.t.Fatalf("connection failed: %v", err)
	}
}

// closedByServer asserts that the server closes the connection within d.
func (rc *rawConn) closedByServer(d time.Duration) {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, rc.r)
	if isTimeout(err) {
		rc.t.Fatalf("the server did not close the connection within %v", d)
	}
}

func TestServerNeedsOptIn(t *testing.T) {
	_, err := NewServer("")
	if !errors.Is(err, store.ErrInvalidArgument) || !strings.Contains(err.Error(), "no authentication") {
		t.Fatalf("NewServer without Unauthenticated: %v, want ErrInvalidArgument naming the missing authentication", err)
	}
}

func TestServerListensOnLoopbackByDefault(t *testing.T) {
	for _, addr := range []string{"", ":0"} {
		srv, err := NewServer(addr, Unauthenticated())
		noErr(t, err)
		host, _, _ := net.SplitHostPort(srv.Addr())
		srv.Close()
		if host != "127.0.0.1" {
			t.Fatalf("NewServer(%q) listens on %s, want loopback", addr, srv.Addr())
		}
	}
	if _, err := NewServer("no-port", Unauthenticated()); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("NewServer with a bad address: %v", err)
	}
}

// TestServerWaitParksWhileServing: a parked WAIT does not stop the
// connection's later queries, and STOP_WAITING comes when the key is set, as
// torch 1.13's server does.
func TestServerWaitParksWhileServing(t *testing.T) {
	srv := startServer(t)
	rc := rawDial(t, srv.Addr())
	rc.send(encodeQuery(query{typ: qWait, keys: []string{"/k", "/j"}}))
	rc.quiet(50 * time.Millisecond)
	rc.send(encodeQuery(query{typ: qNumKeys}))
	if n := rc.readU64(); n != 0 {
		t.Fatalf("num keys = %d", n)
	}
	c := dialT(t, srv)
	ctx := ctxFor(t, long)
	noErr(t, c.Set(ctx, "k", []byte("v")))
	rc.quiet(50 * time.Millisecond)
	must(c.Add(ctx, "j", 1)).get(t)
	if b := rc.read(1); b[0] != stopWaiting {
		t.Fatalf("wait answer %d", b[0])
	}
	// A WAIT on present keys is answered at once.
	rc.send(encodeQuery(query{typ: qWait, keys: []string{"/k"}}))
	if b := rc.read(1); b[0] != stopWaiting {
		t.Fatalf("wait answer %d", b[0])
	}
	// A connection that goes away leaves no parked WAIT behind.
	rc2 := rawDial(t, srv.Addr())
	rc2.send(encodeQuery(query{typ: qWait, keys: []string{"/gone"}}))
	rc2.send(encodeQuery(query{typ: qNumKeys}))
	rc2.readU64()
	rc2.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		srv.mu.Lock()
		n := len(srv.waiting)
		srv.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still have parked WAITs after their connection closed", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServerWatchKey: WATCH_KEY is answered with a registration, then a
// notification for each change of the key.
func TestServerWatchKey(t *testing.T) {
	srv := startServer(t)
	w := rawDial(t, srv.Addr())
	w.send(encodeQuery(query{typ: qWatchKey, key: "/k"}))
	if b := w.read(1); b[0] != watchRegistered {
		t.Fatalf("registration reply %d", b[0])
	}
	c := dialT(t, srv)
	ctx := ctxFor(t, long)
	expect := func(kind byte, old, value string) {
		t.Helper()
		if b := w.read(1); b[0] != kind {
			t.Fatalf("notification kind %d, want %d", b[0], kind)
		}
		if k := w.readBytes(); k != "/k" {
			t.Fatalf("notification key %q", k)
		}
		if o, v := w.readBytes(), w.readBytes(); o != old || v != value {
			t.Fatalf("notification old %q new %q, want %q %q", o, v, old, value)
		}
	}
	noErr(t, c.Set(ctx, "k", []byte("a")))
	expect(watchCreated, "", "a")
	noErr(t, c.Set(ctx, "k", []byte("b")))
	expect(watchUpdated, "a", "b")
	must(c.CompareSet(ctx, "k", []byte("b"), []byte("7"))).get(t)
	expect(watchUpdated, "b", "7")
	must(c.CompareSet(ctx, "k", []byte("no"), []byte("x"))).get(t) // no change, no notification
	must(c.Add(ctx, "k", 1)).get(t)
	expect(watchUpdated, "7", "8")
	noErr(t, c.Set(ctx, "other", nil))
	must(c.DeleteKey(ctx, "k")).get(t)
	expect(watchDeleted, "8", "")
	must(c.DeleteKey(ctx, "k")).get(t) // absent: no notification
	must(c.Add(ctx, "k", 2)).get(t)
	expect(watchCreated, "", "2")
	w.quiet(50 * time.Millisecond)
}

// TestServerClosesOnBadQueries: what torch's server answers by closing the
// connection is closed, with the reason logged, and others are served on.
func TestServerClosesOnBadQueries(t *testing.T) {
	key := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	cases := []struct {
		name string
		send []byte
		log  string
	}{
		{"unknown type", []byte{9}, "unknown query type 9"},
		{"get of a missing key", encodeQuery(query{typ: qGet, key: "/missing"}), "GET of missing key"},
		{"add to text", append(encodeQuery(query{typ: qSet, key: "/t", value: []byte("abc")}),
			encodeQuery(query{typ: qAdd, key: "/t", delta: 1})...), "not an integer counter"},
		{"oversized key", append([]byte{qSet}, key(1<<40)...), "over the size limit"},
		{"too many keys", append([]byte{qWait}, key(1<<40)...), "over the size limit"},
		{"torch 2.x VALIDATE", []byte{0, 0xCE, 0xF7, 0x85, 0x3C, 1, 2, 3, 4}, "VALIDATE"},
		{"truncated", []byte{qSet, 4, 0, 0, 0, 0, 0, 0, 0, '/', 'a'}, "closed in the middle of a query"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs testlog.Buffer
			srv := startServer(t, WithLogger(logs.Logger()), WithMaxValue(1<<20))
			rc := rawDial(t, srv.Addr())
			rc.send(c.send)
			if c.name == "truncated" {
				rc.c.(*net.TCPConn).CloseWrite()
			}
			rc.closedByServer(5 * time.Second)
			waitFor(t, func() bool { return strings.Contains(logs.String(), c.log) },
				"the log to say %q; it holds:\n%s", c.log, &logs)
			cl := dialT(t, srv)
			noErr(t, cl.Set(ctxFor(t, long), "still", []byte("served")))
		})
	}
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for "+format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServerQueryDeadline: a query that stops halfway is cut off after the
// query timeout; a connection that says nothing at all stays open (torch's
// second connection does that).
func TestServerQueryDeadline(t *testing.T) {
	var logs testlog.Buffer
	srv := startServer(t, WithQueryTimeout(200*time.Millisecond), WithLogger(logs.Logger()))
	silent := rawDial(t, srv.Addr())
	stalled := rawDial(t, srv.Addr())
	stalled.send([]byte{qSet, 200, 0, 0, 0, 0, 0, 0, 0, '/'})
	start := time.Now()
	stalled.closedByServer(10 * time.Second)
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("stalled query cut off after %v, before its 200ms", el)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "did not arrive in full in time") },
		"the log to name the deadline; it holds:\n%s", &logs)
	time.Sleep(300 * time.Millisecond)
	silent.send(encodeQuery(query{typ: qNumKeys}))
	if n := silent.readU64(); n != 0 {
		t.Fatalf("num keys %d", n)
	}
}

// TestServerConnectionCaps: connections over the caps are closed at once and
// logged once per interval, not once each; the others are served.
func TestServerConnectionCaps(t *testing.T) {
	var logs testlog.Buffer
	srv := startServer(t, WithMaxConns(6, 4), WithLogger(logs.Logger()))
	var held []*rawConn
	for range 4 {
		held = append(held, rawDial(t, srv.Addr()))
	}
	waitFor(t, func() bool { return srv.NumConns() == 4 }, "4 connections; have %d", srv.NumConns())
	for range 20 {
		rawDial(t, srv.Addr()).closedByServer(5 * time.Second)
	}
	if n := strings.Count(logs.String(), "refused a connection"); n != 1 {
		t.Fatalf("%d warnings for 20 refused connections, want 1 (rate-limited); log:\n%s", n, &logs)
	}
	if srv.NumConns() != 4 {
		t.Fatalf("%d connections open, want 4", srv.NumConns())
	}
	held[0].c.Close()
	waitFor(t, func() bool { return srv.NumConns() == 3 }, "a closed connection to be forgotten")
	c := dialT(t, srv)
	noErr(t, c.Set(ctxFor(t, long), "k", []byte("v")))
	for _, h := range held[1:] {
		h.send(encodeQuery(query{typ: qNumKeys}))
		if n := h.readU64(); n != 1 {
			t.Fatalf("num keys %d", n)
		}
	}
}

// TestServerAllocatesAsBytesArrive: peers that announce large values and
// send nothing more cost the server little memory.
func TestServerAllocatesAsBytesArrive(t *testing.T) {
	srv := startServer(t)
	const conns = 40
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range conns {
		rc := rawDial(t, srv.Addr())
		rc.send(append([]byte{qSet}, binary.LittleEndian.AppendUint64(nil, store.DefaultMaxValue-1)...))
	}
	waitFor(t, func() bool { return srv.NumConns() == conns }, "%d connections", conns)
	time.Sleep(100 * time.Millisecond)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// Announced: 40 x 64 MiB. Allowed: a goroutine, buffers and change per
	// peer.
	if limit := int64(conns * (32 << 10)); grew > limit {
		t.Fatalf("heap grew %d bytes for %d peers announcing 64 MiB keys, want at most %d", grew, conns, limit)
	}
	t.Logf("heap grew %d bytes for %d peers that each announced a %d-byte key", grew, conns, store.DefaultMaxValue-1)
}

// TestServerDropsPeerLeavingRepliesUnread: a peer that asks and never reads
// is disconnected once its unread replies pass the bound.
func TestServerDropsPeerLeavingRepliesUnread(t *testing.T) {
	var logs testlog.Buffer
	srv := startServer(t, WithMaxValue(256<<10), WithLogger(logs.Logger()))
	c := dialT(t, srv)
	noErr(t, c.Set(ctxFor(t, long), "big", bytes.Repeat([]byte{'x'}, 256<<10)))
	rc := rawDial(t, srv.Addr())
	get := encodeQuery(query{typ: qGet, key: "/big"})
	var reqs []byte
	for range 512 { // 128 MiB of replies asked for
		reqs = append(reqs, get...)
	}
	go func() {
		rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		rc.c.Write(reqs)
	}()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "leaves replies unread") },
		"the peer to be dropped; log:\n%s", &logs)
	rc.closedByServer(10 * time.Second)
	noErr(t, c.Set(ctxFor(t, long), "k", nil))
}

// TestDialWaitsForServer: Dial retries while the server is not up yet, as
// torch clients do.
func TestDialWaitsForServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	ln.Close()
	served := make(chan *Server, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		srv, err := NewServer(addr, Unauthenticated(), WithLogger(quietLogger(t)))
		if err != nil {
			t.Error(err)
			served <- nil
			return
		}
		go srv.Serve(context.Background())
		served <- srv
	}()
	c, err := Dial(ctxFor(t, long), addr)
	srv := <-served
	if srv != nil {
		defer srv.Close()
	}
	noErr(t, err)
	defer c.Close()
	noErr(t, c.Set(ctxFor(t, long), "k", nil))
}

func TestDialGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = Dial(ctx, addr)
	if !errors.Is(err, store.ErrTimeout) || !errors.Is(err, store.ErrPeerLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial of a dead address: %v, want ErrTimeout, ErrPeerLost and DeadlineExceeded", err)
	}
	_, err = Dial(context.Background(), addr, WithTimeout(200*time.Millisecond))
	if !errors.Is(err, store.ErrTimeout) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial of a dead address with a client timeout: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err = Dial(ctx, addr); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Dial: %v, want context.Canceled", err)
	}
}

// TestCloseEndsRedial: Close cuts short a call that is dialling a server
// that went away.
func TestCloseEndsRedial(t *testing.T) {
	srv, err := NewServer("", Unauthenticated(), WithLogger(quietLogger(t)))
	noErr(t, err)
	go srv.Serve(context.Background())
	c := dialT(t, srv)
	srv.Close()
	c.mu.Lock()
	for _, cc := range c.idle {
		cc.c.Close()
	}
	c.idle = nil
	c.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctxFor(t, long), "k")
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Get dialling across Close: %v, want ErrClosed", err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("Get returned %v after Close", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get kept dialling after Close")
	}
}

// TestClientAfterServerRestart: idle pooled connections that died with the
// server are replaced without the caller seeing it, for calls that may be
// repeated.
func TestClientAfterServerRestart(t *testing.T) {
	srv, err := NewServer("", Unauthenticated(), WithLogger(quietLogger(t)))
	noErr(t, err)
	addr := srv.Addr()
	go srv.Serve(context.Background())
	c := dialT(t, srv)
	ctx := ctxFor(t, long)
	noErr(t, c.Set(ctx, "k", []byte("v1")))
	srv.Close()
	srv2, err := NewServer(addr, Unauthenticated(), WithLogger(quietLogger(t)))
	noErr(t, err)
	go srv2.Serve(context.Background())
	defer srv2.Close()
	noErr(t, c.Set(ctx, "k", []byte("v2")))
	if v := string(must(c.Get(ctx, "k")).get(t)); v != "v2" {
		t.Fatalf("Get after restart = %q", v)
	}
	// A non-repeatable call on a dead pooled connection reports the loss.
	srv2.Close()
	_, err = c.Add(ctxFor(t, time.Second), "n", 1)
	t.Logf("Add: %v", err)
	if !errors.Is(err, store.ErrPeerLost) {
		t.Fatalf("Add across a lost server: %v, want ErrPeerLost", err)
	}
}
