//go:build linux

package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/floodtest"
)

// rank0Env makes a re-executed test binary act as rank 0 of a world of two
// for TestRank0Flood: it embeds the store server (printing "STORE
// host:port"), forms the group, echoes rank 1's messages, and exits when its
// stdin closes. It logs to stderr.
const rank0Env = "TANDEM_TCP_FLOOD_RANK0"

const floodToken = "flood-secret"

// TestHelperFloodRank0 is rank 0 of TestRank0Flood in its own process, not
// a test of its own: outside that process it returns at once.
func TestHelperFloodRank0(t *testing.T) { childtest.Main(rank0Env, "rank 0", floodRank0) }

func floodRank0(stop context.Context, _ string) error {
	ctx, cancel := context.WithTimeout(stop, 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken(floodToken), store.WithLogger(log))
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Printf("STORE %s\n", st.Addr())
	defer floodtest.ServeFreeOSMemory()()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 0, Size: 2, Store: st, Token: floodToken, Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer tr.Close()
	buf := make([]byte, 4096)
	for {
		if err := tr.Recv(ctx, 1, 1, buf); err != nil {
			break
		}
		if err := tr.Send(ctx, 1, 2, buf); err != nil {
			break
		}
	}
	<-stop.Done()
	return nil
}

// TestRank0Flood floods a live rank 0 in another process, the store server
// it embeds and the listener its peers connect to while the group forms,
// with thousands of idle connections: its memory must stay bounded and come
// back, it must write a few warning lines, not one per connection, and the
// group must still form and work.
func TestRank0Flood(t *testing.T) {
	// The store's flood and the listener's are held at once: the store gets
	// n connections, the listener as many as the open-file limit leaves.
	n := floodtest.Conns(4000)
	limit, err := floodtest.RaiseFileLimit(2*n + 512)
	if err != nil {
		t.Fatal(err)
	}
	if limit < 2512 {
		t.Fatalf("open-file limit %d is too low for a flood test (need at least 2512)", limit)
	}
	n = min(n, limit-1512)
	meshN := min(n, limit-512-n)
	if meshN < n {
		t.Logf("open-file limit %d: flooding the store with %d connections, the listener with %d", limit, n, meshN)
	}
	ctx := ctxTimeout(t, time.Minute)

	child := childtest.Start(t, "rank 0", "TestHelperFloodRank0", rank0Env+"=1")
	storeAddr, pid, out, logs := child.Line(t, "STORE"), child.Pid, child.Out, child.Logs

	st, err := store.NewTCP(ctx, storeAddr, false, store.WithToken(floodToken))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Rank 0 has published where its peers reach it: its listener is up.
	v, err := st.Get(ctx, addrKey(0))
	if err != nil {
		t.Fatal(err)
	}
	meshAddr := strings.Split(string(v), ",")[0]
	base, baseHeld, err := floodtest.RSSAfterFree(pid, out)
	if err != nil {
		t.Fatal(err)
	}

	report := func(what string, f *floodtest.Flood, n int) {
		t.Logf("%s: %d idle connections from %s reached rank 0 in %v (%d reset before the dial returned; %d attempts failed, first error: %v)",
			what, f.Reached(), floodtest.FloodHost, f.Took.Round(time.Millisecond), f.Reset, f.Failed, f.Err)
		if f.Reached() < n*9/10 {
			t.Fatalf("%s: only %d of %d flood connections reached rank 0", what, f.Reached(), n)
		}
	}
	// The store in two waves (a client that reconnects), then the listener.
	f := floodtest.Open(ctx, storeAddr, n, floodtest.FloodHost)
	report("store, wave 1", f, n)
	time.Sleep(300 * time.Millisecond)
	f.Close()
	time.Sleep(500 * time.Millisecond)
	fs := floodtest.Open(ctx, storeAddr, n, floodtest.FloodHost)
	defer fs.Close()
	report("store, wave 2", fs, n)
	fm := floodtest.Open(ctx, meshAddr, meshN, floodtest.FloodHost)
	defer fm.Close()
	report("listener", fm, meshN)

	// The group forms and works during the flood.
	start := time.Now()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 1, Size: 2, Store: st, Token: floodToken, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("rank 1 could not join rank 0 during the flood: %v", err)
	}
	defer tr.Close()
	msg := bytes.Repeat([]byte("tandem.."), 512) // rank 0 echoes 4096 bytes
	back := make([]byte, len(msg))
	if err := tr.Send(ctx, 0, 1, msg); err != nil {
		t.Fatal(err)
	}
	if err := tr.Recv(ctx, 0, 2, back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(msg, back) {
		t.Fatal("rank 0 echoed something else")
	}
	if err := st.Set(ctx, "during", []byte("flood")); err != nil {
		t.Fatal(err)
	}
	t.Logf("group formed and exchanged a message during the flood in %v", time.Since(start).Round(time.Millisecond))

	// The listener lives only while the group forms.
	if c, err := net.DialTimeout("tcp", meshAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("rank 0's listener %s still accepts connections after the group formed", meshAddr)
	}

	// Hold the flood past the handshake deadline, so that the connections
	// rank 0 admitted time out too.
	time.Sleep(admit.HandshakeTimeout + time.Second)
	peak, err := floodtest.PeakRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	fs.Close()
	fm.Close()
	time.Sleep(time.Second)
	// The child returns its free memory first (a measuring aid: the runtime
	// does that lazily), so that the figure says what rank 0 still holds.
	after, afterHeld, err := floodtest.RSSAfterFree(pid, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, 0, 1, msg); err != nil {
		t.Fatal(err)
	}
	if err := tr.Recv(ctx, 0, 2, back); err != nil {
		t.Fatal(err)
	}

	floodtest.Memory{Base: base, Peak: peak, After: after, BaseHeld: baseHeld, AfterHeld: afterHeld}.Check(t, "rank 0")
	const warnLines = 8
	warns := floodtest.CountLines(logs.String(), "level=WARN")
	if warns > warnLines {
		t.Errorf("rank 0 wrote %d warning lines about the flood; want at most %d:\n%s", warns, warnLines, logs)
	}
}

// TestSetupFloodErrorStaysShort floods the listener of a rank whose peer
// never comes with idle and junk connections: the set-up timeout error
// lists a few of the refused connections, counts the rest and the ones
// turned away over the handshake cap, and stays short.
func TestSetupFloodErrorStaysShort(t *testing.T) {
	st := newStore(t)
	failed := make(chan error, 1)
	go func() {
		_, err := loopback.ConnectTCP(context.Background(), transport.Config{Rank: 0, Size: 2, Store: st, Token: floodToken, Timeout: 4 * time.Second})
		failed <- err
	}()
	ctx := ctxTimeout(t, 20*time.Second)
	v, err := st.Get(ctx, addrKey(0))
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.Split(string(v), ",")[0]
	idle := floodtest.Open(ctx, addr, 2*admit.MaxPendingPerHost, floodtest.FloodHost)
	defer idle.Close()
	junk := floodtest.Open(ctx, addr, 50, "127.0.0.3")
	defer junk.Close()
	junk.Each(func(c net.Conn) { c.Write(bytes.Repeat([]byte("junk"), helloSize/4)) })

	err = <-failed
	if !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("set-up under a flood: %v, want ErrTimeout", err)
	}
	mustContain(t, err, "no connection from ranks [1]", "bad hello", "more", "turned away because too many were in their handshake")
	if len(err.Error()) > 4096 {
		t.Errorf("the set-up error takes %d bytes:\n%v", len(err.Error()), err)
	}
}
