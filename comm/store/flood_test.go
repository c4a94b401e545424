//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/floodtest"
	"github.com/tandemml/tandem/internal/testlog"
)

// floodEnv makes a re-executed test binary run a store server for
// TestTCPServerFlood: it prints "ADDR host:port", logs to stderr, and serves
// until its stdin closes.
const floodEnv = "TANDEM_STORE_FLOOD_SERVER"

const floodToken = "flood-secret"

// TestHelperFloodServer is the child's body, not a test of its own: outside
// a child it returns at once.
func TestHelperFloodServer(t *testing.T) {
	childtest.Main(floodEnv, "child", func(stop context.Context, _ string) error {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		srv, err := NewServer("127.0.0.1:0", WithToken(floodToken), WithLogger(log))
		if err != nil {
			return err
		}
		fmt.Printf("ADDR %s\n", srv.Addr())
		defer floodtest.ServeFreeOSMemory()()
		go func() {
			<-stop.Done()
			srv.Close()
		}()
		return srv.Serve(context.Background())
	})
}

// floodWarnLines bounds the warning lines a flood may write.
const floodWarnLines = 8

// TestTCPServerFlood opens thousands of idle connections to a standalone
// store server in another process, twice, and checks that its memory stays bounded
// and comes back, that it writes a few warning lines, not one per
// connection, and that legitimate clients are served throughout.
func TestTCPServerFlood(t *testing.T) {
	n := floodtest.Conns(4000)
	limit, err := floodtest.RaiseFileLimit(n + 512)
	noErr(t, err)
	if limit < n+512 {
		n = limit - 512
		t.Logf("open-file limit %d: flooding with %d connections", limit, n)
	}
	if n < 1000 {
		t.Fatalf("open-file limit %d is too low for a flood test (need at least 1512)", limit)
	}
	ctx := ctxFor(t, time.Minute)

	child := childtest.Start(t, "flood server", "TestHelperFloodServer", floodEnv+"=1")
	addr, pid, out, logs := child.Line(t, "ADDR"), child.Pid, child.Out, child.Logs

	c := dialT(t, addr, WithToken(floodToken))
	for i := range 100 {
		noErr(t, c.Set(ctx, fmt.Sprint("warm/", i), []byte("up")))
	}
	base, baseHeld, err := floodtest.RSSAfterFree(pid, out)
	noErr(t, err)

	// Two waves, as from a client that reconnects: the second reuses what
	// the server freed after the first, which a server that allocated per
	// connection would have to zero, page by page.
	var f *floodtest.Flood
	for wave := 1; wave <= 2; wave++ {
		f = floodtest.Open(ctx, addr, n, floodtest.FloodHost)
		t.Logf("wave %d: %d idle connections from %s reached the server in %v (%d reset before the dial returned; %d attempts failed, first error: %v)",
			wave, f.Reached(), floodtest.FloodHost, f.Took.Round(time.Millisecond), f.Reset, f.Failed, f.Err)
		if f.Reached() < n*9/10 {
			f.Close()
			t.Fatalf("only %d of %d flood connections reached the server", f.Reached(), n)
		}
		if wave == 1 {
			time.Sleep(300 * time.Millisecond)
			f.Close()
			time.Sleep(500 * time.Millisecond)
		}
	}
	defer f.Close()

	// Clients on another host are served while the flood holds its slots:
	// the existing client, and a new one that must say hello.
	legit := time.Now()
	noErr(t, c.Set(ctx, "during", []byte("flood")))
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	fresh, err := Dial(dctx, addr, WithToken(floodToken), WithLogger(quietLogger()))
	cancel()
	if err != nil {
		t.Fatalf("a new client could not connect during the flood: %v", err)
	}
	v := must(fresh.Get(ctx, "during")).get(t)
	noErr(t, fresh.Close())
	if string(v) != "flood" {
		t.Fatalf("Get during the flood = %q", v)
	}
	t.Logf("legitimate clients served during the flood in %v", time.Since(legit).Round(time.Millisecond))

	// Hold the flood past the handshake deadline, so that the connections the
	// server admitted time out too.
	time.Sleep(admit.HandshakeTimeout + time.Second)
	peak, err := floodtest.PeakRSS(pid)
	noErr(t, err)
	f.Close()
	time.Sleep(time.Second)
	after, afterHeld, err := floodtest.RSSAfterFree(pid, out)
	noErr(t, err)
	noErr(t, c.Set(ctx, "after", []byte("flood")))

	floodtest.Memory{Base: base, Peak: peak, After: after, BaseHeld: baseHeld, AfterHeld: afterHeld}.Check(t, "the store server")
	warns := floodtest.CountLines(logs.String(), "level=WARN")
	if warns > floodWarnLines || warns == 0 {
		t.Errorf("the server wrote %d warning lines about %d connections; want between 1 and %d:\n%s", warns, f.Reached(), floodWarnLines, logs)
	}
}

// TestTCPClientWaitsOutHandshakeCap fills a server's handshake slots with
// idle connections from the client's own host: a client dialling meanwhile
// is turned away, dials again, and gets through once slots free up; with no
// slot freed in time it fails with ErrTimeout, not a hard error.
func TestTCPClientWaitsOutHandshakeCap(t *testing.T) {
	logs := &testlog.Buffer{}
	srv := startServer(t, WithMaxPending(8, 4), WithLogger(logs.Logger()))
	var idle []net.Conn
	hold := func(k int) {
		for range k {
			c, err := net.Dial("tcp", srv.Addr())
			noErr(t, err)
			idle = append(idle, c)
		}
		// Wait until the server has admitted them.
		for end := time.Now().Add(5 * time.Second); srv.gate.Pending() < k && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := srv.gate.Pending(); got != k {
			t.Fatalf("%d connections in their handshake, want %d", got, k)
		}
	}
	release := func() {
		for _, c := range idle {
			c.Close()
		}
		idle = nil
	}
	defer release()

	hold(4)
	ctx := ctxFor(t, long)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := Dial(short, srv.Addr(), WithLogger(quietLogger()), WithToken(""))
	cancel()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Dial while its host's slots are full: %v, want ErrTimeout", err)
	}
	if srv.gate.Refused() == 0 {
		t.Fatal("the gate refused nothing while full")
	}

	done := make(chan error, 1)
	go func() {
		s, err := Dial(ctx, srv.Addr(), WithLogger(quietLogger()), WithToken(""))
		if err == nil {
			err = s.Set(ctx, "k", []byte("v"))
			s.Close()
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Dial got through while every slot of its host was taken (err %v)", err)
	default:
	}
	release()
	select {
	case err := <-done:
		noErr(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Dial did not get through after the slots were freed")
	}
	if !strings.Contains(logs.String(), "too many connections are saying hello") {
		t.Errorf("the server did not warn about the refused connections:\n%s", logs)
	}
}
