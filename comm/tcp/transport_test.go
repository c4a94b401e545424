package tcp

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/comm/transport/transporttest"
	"github.com/tandemml/tandem/internal/testkit"
)

// TestTransportContract runs the point-to-point contract over both data
// paths between local ranks.
func TestTransportContract(t *testing.T) {
	for _, path := range dataPaths {
		t.Run(path.name, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
				return transporttest.Connect(t, path.backend, n, func(_ int, cfg *transport.Config) { cfg.Token = "secret" })
			})
		})
	}
}

func TestWorldOfOne(t *testing.T) {
	tr, err := loopback.Connect(context.Background(), transport.Config{Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := ctxTimeout(t, 5*time.Second)
	if err := tr.Send(ctx, 0, 1, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if err := tr.Recv(ctx, 0, 1, b); err != nil || string(b) != "hi" {
		t.Fatalf("got %q, %v", b, err)
	}
	if err := tr.Send(ctx, 1, 1, b); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("send to rank 1 of a world of 1: want ErrInvalidArgument, got %v", err)
	}
}

func TestSendWaitingForLineHonoursContext(t *testing.T) {
	ts := connectAll(t, 2, nil)
	p := ts[0].peers[1]
	p.wsem <- struct{}{} // someone else holds the line
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := ts[0].Send(ctx, 1, 1, []byte("x"))
	<-p.wsem
	if !errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
}

func TestTooLarge(t *testing.T) {
	ts := connectAll(t, 2, func(rank int, cfg *transport.Config) {
		cfg.MaxMessage = 1024
		if rank == 0 {
			cfg.MaxMessage = 4096
		}
	})
	ctx := ctxTimeout(t, 10*time.Second)
	if err := ts[1].Send(ctx, 0, 1, make([]byte, 1025)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("send above the limit: want ErrTooLarge, got %v", err)
	}
	if err := ts[1].Recv(ctx, 0, 1, make([]byte, 1025)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("recv above the limit: want ErrTooLarge, got %v", err)
	}
	// Rank 0 allows more than rank 1 accepts: the receive fails, the link survives.
	if err := ts[0].Send(ctx, 1, 2, make([]byte, 2000)); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Recv(ctx, 0, 2, make([]byte, 1000)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("oversized incoming message: want ErrTooLarge, got %v", err)
	}
	if err := ts[0].Send(ctx, 1, 2, []byte("fine")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if err := ts[1].Recv(ctx, 0, 2, b); err != nil || string(b) != "fine" {
		t.Fatalf("after an oversized message: %q, %v", b, err)
	}
}

func TestPeerCrashFailsPendingAndFutureOps(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	// A message that fully arrived before the crash stays receivable.
	if err := ts[1].Send(ctx, 0, 2, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- ts[0].Recv(ctx, 1, 1, make([]byte, 8)) }()
	time.Sleep(50 * time.Millisecond)
	// Simulate a crash: the socket goes away with no goodbye.
	ts[1].peers[0].conn.Close()
	err := <-errc
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("want ErrPeerLost, got %v", err)
	}
	mustContain(t, err, "rank 1")
	if err := ts[0].Send(ctx, 1, 1, []byte("x")); !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("send after loss: want ErrPeerLost, got %v", err)
	}
	b := make([]byte, 10)
	if err := ts[0].Recv(ctx, 1, 2, b); err != nil || string(b) != "last words" {
		t.Fatalf("message that arrived before the loss: %q, %v", b, err)
	}
}

func TestCloseLeavesNoGoroutinesOrSockets(t *testing.T) {
	runtime.GC()
	baseG, baseFD := runtime.NumGoroutine(), openFDs()
	for round := 0; round < 3; round++ {
		st := newStore(t)
		ts, errs := connectWorld(4, st, nil)
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		ctx := ctxTimeout(t, 10*time.Second)
		var wg sync.WaitGroup
		for r := range ts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				next, prev := (r+1)%4, (r+3)%4
				if err := ts[r].Send(ctx, next, 1, make([]byte, 1<<16)); err != nil {
					t.Error(err)
				}
				if err := ts[r].Recv(ctx, prev, 1, make([]byte, 1<<16)); err != nil {
					t.Error(err)
				}
				// leave an unreceived message behind
				ts[r].Send(ctx, next, 2, make([]byte, 100))
			}()
		}
		wg.Wait()
		for _, tr := range ts {
			wg.Add(1)
			go func() { defer wg.Done(); tr.Close() }()
		}
		wg.Wait()
		st.Close()
	}
	testkit.AssertNoLeak(t, baseG)
	if baseFD >= 0 && !settle(func() bool { return openFDs() <= baseFD }) {
		t.Errorf("file descriptors: %d before, %d after Close", baseFD, openFDs())
	}
}

func TestSendRecvDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, so allocations cannot be counted")
	}
	ts := connectAll(t, 2, nil)
	ctx := context.Background()
	buf := make([]byte, 4096)
	dst := make([]byte, 4096)
	// A long-lived receiver, so that both the posted-first and the
	// arrived-first paths are exercised without spawning goroutines.
	start, done := make(chan struct{}), make(chan error)
	go func() {
		for range start {
			done <- ts[1].Recv(ctx, 0, 1, dst)
		}
	}()
	defer close(start)
	exchange := func() {
		start <- struct{}{}
		if err := ts[0].Send(ctx, 1, 1, buf); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		exchange()
	}
	if n := testing.AllocsPerRun(500, exchange); n > 0.05 {
		t.Errorf("Send+Recv allocates %.2f objects per message; want 0", n)
	}
	// With a cancellable context Send registers a context.AfterFunc; that
	// is the only allocation allowed.
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if n := testing.AllocsPerRun(200, func() {
		if err := ts[0].Send(cctx, 1, 2, buf); err != nil {
			t.Fatal(err)
		}
		if err := ts[1].Recv(cctx, 0, 2, dst); err != nil {
			t.Fatal(err)
		}
	}); n > 3 {
		t.Errorf("Send+Recv with a cancellable context allocates %.2f objects per message", n)
	}
}
