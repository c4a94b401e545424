package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/internal/testlog"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startServer runs a TCP store server on a free loopback port until the test ends.
func startServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{WithLogger(quietLogger()), WithToken("")}, opts...)
	srv, err := NewServer("127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

func dialT(t *testing.T, addr string, opts ...Option) Store {
	t.Helper()
	opts = append([]Option{WithLogger(quietLogger()), WithToken("")}, opts...)
	s, err := Dial(ctxFor(t, long), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestTCPNoGoroutineLeak(t *testing.T) {
	testkit.CheckLeaks(t)
	ctx := ctxFor(t, long)
	master, err := NewTCP(ctx, "127.0.0.1:0", true, WithLogger(quietLogger()), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	var clients []Store
	for range 8 {
		c, err := Dial(ctx, master.Addr(), WithLogger(quietLogger()), WithToken(""))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	// Leave blocked requests behind on the server and in the clients.
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			_, err := c.Get(ctx, "never")
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Get blocked across Close: %v, want ErrClosed", err)
			}
		})
	}
	noErr(t, master.Set(ctx, "k", []byte("v")))
	time.Sleep(20 * time.Millisecond)
	for _, c := range clients {
		noErr(t, c.Close())
	}
	wg.Wait()
	noErr(t, master.Close())
}

func TestServerCloseReleasesClients(t *testing.T) {
	testkit.CheckLeaks(t)
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	c := dialT(t, srv.Addr(), WithTimeout(300*time.Millisecond))
	ctx := context.Background() // the store's timeout bounds the Get
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	noErr(t, srv.Close())
	noErr(t, <-served)
	// The client tries to reconnect for the rest of its timeout (shorter
	// than GoneAfter here), then gives up.
	if err := <-errc; !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrPeerLost) {
		t.Fatalf("Get on a server that closed: %v, want ErrTimeout and ErrPeerLost", err)
	}
	noErr(t, c.Close())
}

func TestServeStopsWithContext(t *testing.T) {
	testkit.CheckLeaks(t)
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	c := dialT(t, srv.Addr())
	noErr(t, c.Set(ctxFor(t, long), "k", nil))
	cancel()
	noErr(t, <-served)
	if err := srv.Serve(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close: %v, want ErrClosed", err)
	}
	noErr(t, c.Close())
}

func TestTCPWrongToken(t *testing.T) {
	logs := &testlog.Buffer{}
	srv := startServer(t, WithToken("right"), WithLogger(logs.Logger()))
	ctx := ctxFor(t, long)
	for _, tok := range []string{"wrong", ""} {
		_, err := Dial(ctx, srv.Addr(), WithToken(tok), WithLogger(quietLogger()))
		if !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Dial with token %q: %v, want ErrUnauthorized", tok, err)
		}
	}
	if !strings.Contains(logs.String(), "wrong token") || !strings.Contains(logs.String(), "missing token") {
		t.Fatalf("server log does not give the reasons:\n%s", logs)
	}
	c := dialT(t, srv.Addr(), WithToken("right"))
	noErr(t, c.Set(ctx, "k", []byte("v")))
}

func TestTCPTokenFromEnv(t *testing.T) {
	t.Setenv(TokenEnv, "from-env")
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background())
	defer srv.Close()
	ctx := ctxFor(t, long)
	c, err := Dial(ctx, srv.Addr(), WithLogger(quietLogger()))
	if err != nil {
		t.Fatalf("Dial with the token from %s: %v", TokenEnv, err)
	}
	c.Close()
	if _, err := Dial(ctx, srv.Addr(), WithToken("other"), WithLogger(quietLogger())); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("WithToken overriding the environment: %v, want ErrUnauthorized", err)
	}
}

// rawConn opens a connection that has said a valid hello (to a server
// without a token).
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if r := rawHello(t, c, 0, ""); r.code != codeOK {
		t.Fatalf("hello refused: %v", r)
	}
	return c
}

// expectDropped checks that the server closes c.
func expectDropped(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(long))
	for {
		if _, err := readFrame(c, 1<<20); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("%s: server did not drop the connection", what)
			}
			return
		}
	}
}

func TestTCPBadFrames(t *testing.T) {
	logs := &testlog.Buffer{}
	srv := startServer(t, WithMaxFrame(64<<10), WithLogger(logs.Logger()))
	ctx := ctxFor(t, long)
	good := dialT(t, srv.Addr())
	noErr(t, good.Set(ctx, "before", []byte("ok")))
	// A client blocked in Get must survive the others' misbehaviour.
	blocked := make(chan error, 1)
	go func() {
		v, err := good.Get(ctx, "after")
		if err == nil && string(v) != "yes" {
			err = errors.New("wrong value " + string(v))
		}
		blocked <- err
	}()

	hdr := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	valid := message{op: opSet, id: 1, keys: []string{"k"}, vals: [][]byte{[]byte("v")}}
	frame := appendFrame(nil, &valid)
	cases := []struct {
		name, reason string
		send         []byte
		close        bool // half-close after sending, so that a truncated frame ends
	}{
		{"garbage", "malformed request", append(hdr(5), 0xff, 0xff, 0xff, 0xff, 0xff), false},
		{"unknown op", "malformed request", append(hdr(7), 99, 0, 1, 0, 0, 0, 0), false},
		{"wrong shape", "malformed request", appendFrame(nil, &message{op: opSet, id: 1, keys: []string{"k"}}), false},
		{"empty frame", "cannot read a frame", hdr(0), false},
		{"oversized", "cannot read a frame", hdr(1 << 30), false},
		{"truncated", "cannot read a frame", frame[:len(frame)-2], true},
		{"trailing bytes", "malformed request", func() []byte {
			f := append(frame[:len(frame):len(frame)], 0)
			binary.BigEndian.PutUint32(f, uint32(len(f)-4))
			return f
		}(), false},
	}
	for _, c := range cases {
		conn := rawConn(t, srv.Addr())
		if _, err := conn.Write(c.send); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.close {
			conn.(*net.TCPConn).CloseWrite()
		}
		expectDropped(t, conn, c.name)
		if v := must(good.Get(ctx, "before")).get(t); string(v) != "ok" {
			t.Fatalf("after %s: good client got %q", c.name, v)
		}
	}
	// A garbage hello is refused too.
	conn, err := net.Dial("tcp", srv.Addr())
	noErr(t, err)
	defer conn.Close()
	conn.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	expectDropped(t, conn, "http hello")

	noErr(t, dialT(t, srv.Addr()).Set(ctx, "after", []byte("yes")))
	noErr(t, <-blocked)
	for _, reason := range []string{"malformed request", "cannot read a frame", "no valid hello", "exceeds the limit"} {
		if !strings.Contains(logs.String(), reason) {
			t.Errorf("server log lacks %q:\n%s", reason, logs)
		}
	}
}

func TestTCPSizeLimits(t *testing.T) {
	srv := startServer(t, WithMaxValue(1<<10))
	ctx := ctxFor(t, long)
	big := make([]byte, 2<<10)
	c := dialT(t, srv.Addr(), WithMaxValue(1<<20))
	// The client allows it; the server refuses it and keeps the connection.
	if err := c.Set(ctx, "big", big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Set over the server's limit: %v, want ErrTooLarge", err)
	}
	noErr(t, c.Append(ctx, "grow", big[:600]))
	if err := c.Append(ctx, "grow", big[:600]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append growing past the limit: %v, want ErrTooLarge", err)
	}
	noErr(t, c.Set(ctx, "small", big[:10]))
	// The client refuses before sending when its own limit is lower.
	small := dialT(t, srv.Addr(), WithMaxValue(100))
	if err := small.Set(ctx, "big", big[:200]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Set over the client's limit: %v, want ErrTooLarge", err)
	}
	if err := small.MultiSet(ctx, []string{"a", "b"}, [][]byte{big[:60], big[:60]}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MultiSet over the client's limit: %v, want ErrTooLarge", err)
	}
	noErr(t, small.Set(ctx, "fine", big[:100]))
}

func TestTCPReconnect(t *testing.T) {
	logs := &testlog.Buffer{}
	srv := startServer(t)
	ctx := ctxFor(t, long)
	c := dialT(t, srv.Addr(), WithLogger(logs.Logger()))
	other := dialT(t, srv.Addr())
	noErr(t, c.Set(ctx, "k", []byte("v1")))

	// A Get blocked while the connection drops is repeated on the new one.
	got := make(chan error, 1)
	go func() {
		v, err := c.Get(ctx, "late")
		if err == nil && string(v) != "here" {
			err = errors.New("wrong value " + string(v))
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	srv.dropConnections()
	time.Sleep(20 * time.Millisecond)
	noErr(t, other.Set(ctx, "late", []byte("here")))
	noErr(t, <-got)

	// Later requests of every kind work on the new connection.
	srv.dropConnections()
	if v := must(c.Get(ctx, "k")).get(t); string(v) != "v1" {
		t.Fatalf("Get after reconnect = %q", v)
	}
	srv.dropConnections()
	if n := must(c.Add(ctx, "n", 2)).get(t); n != 2 {
		t.Fatalf("Add after reconnect = %d", n)
	}
	if !strings.Contains(logs.String(), "reconnecting") {
		t.Errorf("client did not log the reconnect:\n%s", logs)
	}
}

func TestTCPWriteRepeatedAfterLostReply(t *testing.T) {
	srv := startServer(t)
	// Every third write runs and then loses its reply with the connection:
	// the client must repeat it, and the server must not apply it again.
	var mu sync.Mutex
	writes := 0
	srv.loseReply = func(m *message) bool {
		mu.Lock()
		defer mu.Unlock()
		if m.op == opGet {
			return false
		}
		writes++
		return writes%3 == 1
	}
	ctx := ctxFor(t, long)
	c := dialT(t, srv.Addr())
	for i := range 6 {
		if n := must(c.Add(ctx, "n", 10)).get(t); n != int64(10*(i+1)) {
			t.Fatalf("Add #%d returned %d, want %d", i+1, n, 10*(i+1))
		}
	}
	noErr(t, c.Append(ctx, "log", []byte("a")))
	noErr(t, c.Append(ctx, "log", []byte("b")))
	noErr(t, c.Append(ctx, "log", []byte("c")))
	if v := must(c.Get(ctx, "log")).get(t); string(v) != "abc" {
		t.Fatalf("log = %q, want abc", v)
	}
	// CompareSet whose reply was lost still reports success when repeated.
	for writes%3 != 0 {
		noErr(t, c.Set(ctx, "pad", nil))
	}
	if v := must(c.CompareSet(ctx, "cas", nil, []byte("mine"))).get(t); string(v) != "mine" {
		t.Fatalf("CompareSet after a lost reply returned %q, want mine", v)
	}
	if ok := must(c.DeleteKey(ctx, "cas")).get(t); !ok {
		t.Fatal("DeleteKey reported false")
	}
}

func TestTCPWritesExactlyOnceAcrossDrops(t *testing.T) {
	srv := startServer(t)
	ctx := ctxFor(t, long)
	c := dialT(t, srv.Addr())
	// Many Adds and Appends in flight while the server drops the connection
	// again and again: every one succeeds, and none is applied twice.
	const n = 300
	var wg sync.WaitGroup
	for i := range n {
		if i%50 == 25 {
			wg.Go(srv.dropConnections)
		}
		wg.Go(func() {
			if _, err := c.Add(ctx, "n", 1); err != nil {
				t.Errorf("Add: %v", err)
			}
			if err := c.Append(ctx, "log", []byte{'x'}); err != nil {
				t.Errorf("Append: %v", err)
			}
		})
	}
	wg.Wait()
	if got := must(c.Add(ctx, "n", 0)).get(t); got != n {
		t.Fatalf("counter = %d after %d acknowledged Adds", got, n)
	}
	if got := must(c.Get(ctx, "log")).get(t); len(got) != n {
		t.Fatalf("log has %d bytes after %d acknowledged Appends", len(got), n)
	}
}

func TestTCPManyClients(t *testing.T) {
	const clients = 256
	srv := startServer(t)
	ctx := ctxFor(t, long)
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	for i := range clients {
		wg.Go(func() {
			s, err := Dial(ctx, srv.Addr(), WithLogger(quietLogger()), WithToken(""))
			if err != nil {
				errc <- err
				return
			}
			defer s.Close()
			if _, err := s.Add(ctx, "arrived", 1); err != nil {
				errc <- err
				return
			}
			// Everyone blocks until the last one arrives, then reads all.
			if i == clients-1 {
				for {
					n, err := s.Add(ctx, "arrived", 0)
					if err != nil {
						errc <- err
						return
					}
					if n == clients {
						break
					}
					time.Sleep(time.Millisecond)
				}
				if err := s.Set(ctx, "go", []byte("1")); err != nil {
					errc <- err
					return
				}
			}
			if _, err := s.Get(ctx, "go"); err != nil {
				errc <- err
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func TestTCPSharedConnection(t *testing.T) {
	// Many goroutines on one client: blocked Gets do not hold up others.
	srv := startServer(t)
	ctx := ctxFor(t, long)
	c := dialT(t, srv.Addr())
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := string(rune('a'+i%26)) + string(rune('0'+i/26))
			if i%2 == 0 {
				if _, err := c.Get(ctx, key+"-pair"); err != nil {
					t.Error(err)
				}
				return
			}
			if err := c.Set(ctx, string(rune('a'+(i-1)%26))+string(rune('0'+(i-1)/26))+"-pair", nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestTCPCancelledWaitIsWithdrawn(t *testing.T) {
	srv := startServer(t)
	c := dialT(t, srv.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Get: %v", err)
	}
	// The server forgets the abandoned waiter.
	for range 500 {
		srv.t.mu.Lock()
		n := len(srv.t.waiting)
		srv.t.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("server still holds the waiter of a cancelled Get")
}

func TestDialUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = Dial(ctx, addr, WithLogger(quietLogger()), WithToken(""))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Dial to a closed port: %v, want ErrTimeout", err)
	}
}

func TestDialWaitsForServer(t *testing.T) {
	// Ranks may dial before rank 0's server is up: Dial keeps trying.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	ln.Close()
	errc := make(chan error, 1)
	go func() {
		s, err := Dial(ctxFor(t, long), addr, WithLogger(quietLogger()), WithToken(""))
		if err == nil {
			err = s.Set(ctxFor(t, long), "k", nil)
			s.Close()
		}
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	srv, err := NewServer(addr, WithLogger(quietLogger()), WithToken(""))
	if err != nil {
		t.Skipf("port %s was taken meanwhile: %v", addr, err)
	}
	go srv.Serve(context.Background())
	defer srv.Close()
	noErr(t, <-errc)
}

func TestTCPLargeValues(t *testing.T) {
	srv := startServer(t)
	ctx := ctxFor(t, long)
	a, b := dialT(t, srv.Addr()), dialT(t, srv.Addr())
	big := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 1<<20) // 7 MiB
	got := make(chan []byte, 1)
	go func() {
		v, err := b.Get(ctx, "big")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	noErr(t, a.Set(ctx, "big", big))
	if v := <-got; !bytes.Equal(v, big) {
		t.Fatalf("7 MiB value came back as %d different bytes", len(v))
	}
	vs := must(b.MultiGet(ctx, []string{"big", "big"})).get(t)
	if !bytes.Equal(vs[0], big) || !bytes.Equal(vs[1], big) {
		t.Fatal("MultiGet of large values differs")
	}
}
