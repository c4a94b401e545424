package rpc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/floodtest"
)

// floodedEnv makes the test binary, re-executed, run worker 1 of
// TestHandshakeFlood, meeting worker 0 through the TCP store at its value.
const floodedEnv = "TANDEM_RPC_TEST_FLOODED"

// TestHelperFloodedWorker is worker 1 of TestHandshakeFlood, in a process
// of its own so that its memory can be measured; it does nothing in a
// normal test run.
func TestHelperFloodedWorker(t *testing.T) {
	childtest.Main(floodedEnv, "the flooded worker", func(stop context.Context, addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		st, err := store.NewTCP(ctx, addr, false)
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		defer st.Close()
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		a, err := Init(ctx, "flooded", 1, 2, WithStore(st), WithRegistry(basics(1)), WithListenAddr("127.0.0.1:0"), WithLogger(log))
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		<-stop.Done() // until the test is done
		a.Close()
		return nil
	})
}

// vmRSS returns the resident memory of process pid in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := floodtest.RSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHandshakeFlood: thousands of idle or junk connections to a worker neither
// grow its memory much nor fill its log, its established connections keep
// working meanwhile, and it takes new ones once the flood ends.
func TestHandshakeFlood(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc to measure a process's memory")
	}
	n := floodtest.Conns(4000)
	limit, err := floodtest.RaiseFileLimit(n + 256)
	if err != nil {
		t.Fatal(err)
	}
	if n+256 > limit {
		n = limit - 256
	}
	if n < 1000 {
		t.Skipf("only %d file descriptors allowed: too few for a flood", limit)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	child := childtest.Start(t, "the flooded worker", "TestHelperFloodedWorker", floodedEnv+"="+st.Addr())
	logs := child.Logs
	reg := NewRegistry()
	registerBasics(0, reg)
	a, err := Init(ctx, "caller", 0, 2, WithStore(st), WithRegistry(reg), WithListenAddr("127.0.0.1:0"))
	if err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	defer a.Close()
	add := func(what string) {
		t.Helper()
		if v, err := Sync[int](ctx, a, "flooded", "add", [2]int{2, 3}); err != nil || v != 5 {
			t.Fatalf("%s: %v %v\n%s", what, v, err, logs.String())
		}
	}
	add("before the flood")
	pid := child.Pid
	time.Sleep(200 * time.Millisecond)
	base := vmRSS(t, pid)

	// The flood, opened from 8 goroutines: n connections, of which a third
	// send nothing, a third the start of a hello and then nothing, and a
	// third junk that the worker refuses.
	target := a.addrs[1]
	conns := make(chan net.Conn, n)
	var wg sync.WaitGroup
	var failed sync.Map
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: 5 * time.Second}
			for i := g; i < n; i += 8 {
				c, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					failed.Store(i, err)
					continue
				}
				switch i % 3 {
				case 1:
					c.Write([]byte(helloMagic))
				case 2:
					c.Write([]byte("GET / HTTP/1.1\r\nHost: worker\r\n\r\n"))
				}
				conns <- c
			}
		}()
	}
	peak := base
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if m, err := floodtest.RSS(pid); err == nil && m > peak {
				peak = m
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	wg.Wait()
	close(conns)
	opened := len(conns)
	add("during the flood") // the established connection still serves
	time.Sleep(time.Second) // the idle connections sit in their handshake
	add("during the flood, a second later")
	close(stop)
	<-watched
	during := vmRSS(t, pid)

	for c := range conns {
		c.Close()
	}
	time.Sleep(time.Second)
	after := vmRSS(t, pid)
	// A new connection is served once the flood is over.
	nc, _, status := rawConnTo(t, target, a.token)
	if status != statusOK {
		t.Fatalf("a new connection after the flood: status %d\n%s", status, logs.String())
	}
	nc.Close()
	add("after the flood")

	var lines int
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "rpc:") {
			lines++
		}
	}
	t.Logf("%d connections opened: worker RSS %.1f MB before, peak %.1f MB, %.1f MB at the end of the flood, %.1f MB after; %d log lines",
		opened, floodtest.MiB(base), floodtest.MiB(peak), floodtest.MiB(during), floodtest.MiB(after), lines)
	if opened < n/2 {
		t.Fatalf("only %d of %d connections opened", opened, n)
	}
	// Before the admission gate and the small hello buffer, 4,000 such
	// connections grew a worker by about 65 MB for good, and 15,000 by
	// about 250 MB; now both stay within a few MB.
	if grew := peak - base; grew > 40<<20 {
		t.Errorf("the worker grew by %.1f MB under the flood", floodtest.MiB(grew))
	}
	if grew := after - base; grew > 40<<20 {
		t.Errorf("the worker kept %.1f MB after the flood", floodtest.MiB(grew))
	}
	if lines > 5 {
		t.Errorf("%d log lines for one flood:\n%s", lines, logs.String())
	}
}

// TestHandshakeGate: a worker serves at most admit.MaxPendingPerHost
// connections in their handshake from one host; the next is closed at once,
// an idle one is closed when the handshake limit passes, and a connection
// with the token gets through once the slots are free.
func TestHandshakeGate(t *testing.T) {
	agents := startGroup(t, 1, registerBasics)
	a := agents[0]
	addr := a.ln.Addr().String()
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	start := time.Now()
	for range admit.MaxPendingPerHost {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.gate.Pending() < admit.MaxPendingPerHost && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p := a.gate.Pending(); p != admit.MaxPendingPerHost {
		t.Fatalf("%d connections in their handshake, want %d", p, admit.MaxPendingPerHost)
	}
	refused := a.Metrics().ConnectionsRefused
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection over the limit: read %d, %v; want it closed at once", n, err)
	}
	if got := a.Metrics().ConnectionsRefused; got != refused+1 {
		t.Fatalf("refused connections: %d, want %d", got, refused+1)
	}
	// The idle ones are closed when the handshake limit passes.
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(admit.HandshakeTimeout + 5*time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("an idle connection: %v; want it closed after %v", err, admit.HandshakeTimeout)
		}
	}
	if d := time.Since(start); d < admit.HandshakeTimeout-500*time.Millisecond {
		t.Fatalf("idle connections closed after %v, before the handshake limit of %v", d, admit.HandshakeTimeout)
	}
	deadline = time.Now().Add(5 * time.Second)
	for a.gate.Pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	nc, _, status := rawConnTo(t, addr, a.token)
	defer nc.Close()
	if status != statusOK {
		t.Fatalf("a connection with the token after the idle ones: status %d", status)
	}
}
