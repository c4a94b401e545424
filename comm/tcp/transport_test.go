package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
)

// payload returns n pseudo-random bytes determined by seed.
func payload(seed, n int) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], uint64(seed))
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b) // fast even under the race detector
	return b
}

func TestOrderingPerTag(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	const n = 200
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(i))
			if err := ts[0].Send(ctx, 1, 7, b[:]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := 0; i < n; i++ {
		if i == n/2 {
			time.Sleep(20 * time.Millisecond) // let some arrive before their Recv
		}
		var b [8]byte
		if err := ts[1].Recv(ctx, 0, 7, b[:]); err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if got := binary.LittleEndian.Uint64(b[:]); got != uint64(i) {
			t.Fatalf("message %d arrived as %d: order broken", i, got)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestUnexpectedMessagesAreBuffered(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 30*time.Second)
	// Every message is sent before any Recv is posted, and received in the
	// reverse order of tags.
	const tags = 20
	for tag := 0; tag < tags; tag++ {
		if err := ts[0].Send(ctx, 1, transport.Tag(tag), payload(tag, 100+tag)); err != nil {
			t.Fatal(err)
		}
	}
	for tag := tags - 1; tag >= 0; tag-- {
		buf := make([]byte, 100+tag)
		if err := ts[1].Recv(ctx, 0, transport.Tag(tag), buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, payload(tag, 100+tag)) {
			t.Fatalf("tag %d: payload corrupted", tag)
		}
	}
}

func TestBigMessage(t *testing.T) {
	for _, path := range dataPaths {
		t.Run(path.name, func(t *testing.T) { testBigMessage(t, path.backend) })
	}
}

func testBigMessage(t *testing.T, b Backend) {
	ts := connectAllWith(t, func(int) Backend { return b }, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	const size = 64 << 20
	src := payload(3, size)
	for _, posted := range []bool{true, false} {
		t.Run(fmt.Sprintf("recv-posted-first=%v", posted), func(t *testing.T) {
			dst := make([]byte, size)
			errc := make(chan error, 1)
			if !posted {
				if err := ts[0].Send(ctx, 1, 1, src); err != nil {
					t.Fatal(err)
				}
			} else {
				go func() {
					time.Sleep(50 * time.Millisecond)
					errc <- ts[0].Send(ctx, 1, 1, src)
				}()
			}
			if err := ts[1].Recv(ctx, 0, 1, dst); err != nil {
				t.Fatal(err)
			}
			if posted {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("64 MiB payload corrupted")
			}
		})
	}
}

func TestConcurrentTagsAllPairs(t *testing.T) {
	const world, tags, rounds = 4, 8, 20
	ts := connectAll(t, world, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	var wg sync.WaitGroup
	errc := make(chan error, world*world*tags*2)
	for src := 0; src < world; src++ {
		for dst := 0; dst < world; dst++ {
			for tag := 0; tag < tags; tag++ {
				wg.Add(2)
				go func() {
					defer wg.Done()
					for i := 0; i < rounds; i++ {
						if err := ts[src].Send(ctx, dst, transport.Tag(tag), payload(src*1000+dst*100+tag*10+i, 512+tag)); err != nil {
							errc <- err
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					buf := make([]byte, 512+tag)
					for i := 0; i < rounds; i++ {
						if err := ts[dst].Recv(ctx, src, transport.Tag(tag), buf); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(buf, payload(src*1000+dst*100+tag*10+i, 512+tag)) {
							errc <- fmt.Errorf("%d->%d tag %d round %d: wrong payload", src, dst, tag, i)
							return
						}
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func TestSendToSelf(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	src := payload(1, 1000)
	if err := ts[1].Send(ctx, 1, 3, src); err != nil {
		t.Fatal(err)
	}
	src[0]++ // the transport must have copied
	dst := make([]byte, 1000)
	if err := ts[1].Recv(ctx, 1, 3, dst); err != nil {
		t.Fatal(err)
	}
	if dst[0] == src[0] || !bytes.Equal(dst[1:], src[1:]) {
		t.Fatal("self-send payload wrong or not copied")
	}
	// A Recv posted first gets the payload directly.
	done := make(chan error, 1)
	go func() { done <- ts[1].Recv(ctx, 1, 4, dst) }()
	time.Sleep(10 * time.Millisecond)
	if err := ts[1].Send(ctx, 1, 4, payload(2, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !bytes.Equal(dst, payload(2, 1000)) {
		t.Fatalf("posted self recv: %v", err)
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

func TestLengthMismatch(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	// Buffered path: message arrives first.
	if err := ts[0].Send(ctx, 1, 9, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	err := ts[1].Recv(ctx, 0, 9, make([]byte, 12))
	if !errors.Is(err, transport.ErrMismatch) {
		t.Fatalf("want ErrMismatch, got %v", err)
	}
	mustContain(t, err, "10 bytes", "12 bytes")
	// Direct path: Recv posted first.
	errc := make(chan error, 1)
	go func() { errc <- ts[1].Recv(ctx, 0, 9, make([]byte, 5)) }()
	time.Sleep(20 * time.Millisecond)
	if err := ts[0].Send(ctx, 1, 9, make([]byte, 7)); err != nil {
		t.Fatal(err)
	}
	err = <-errc
	if !errors.Is(err, transport.ErrMismatch) {
		t.Fatalf("want ErrMismatch, got %v", err)
	}
	mustContain(t, err, "7 bytes", "5 bytes")
	// The stream is still in step afterwards.
	if err := ts[0].Send(ctx, 1, 9, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if err := ts[1].Recv(ctx, 0, 9, b); err != nil || string(b) != "ok" {
		t.Fatalf("after a mismatch: %q, %v", b, err)
	}
}

func TestRecvHonoursContext(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := ts[1].Recv(ctx, 0, 1, make([]byte, 4))
	if !errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want ErrTimeout wrapping DeadlineExceeded, got %v", err)
	}
	// A cancelled receive leaves no trace: the next message goes to the next Recv.
	c2 := ctxTimeout(t, 10*time.Second)
	if err := ts[0].Send(c2, 1, 1, []byte("abcd")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if err := ts[1].Recv(c2, 0, 1, b); err != nil || string(b) != "abcd" {
		t.Fatalf("after a timed-out Recv: %q, %v", b, err)
	}
	// An already cancelled context fails at once, for Send too.
	dead, cancelDead := context.WithCancel(context.Background())
	cancelDead()
	if err := ts[0].Send(dead, 1, 1, b); !errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("send with cancelled ctx: %v", err)
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

func TestAbortPropagates(t *testing.T) {
	ts := connectAll(t, 3, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	errc := make(chan error, 3)
	go func() { errc <- ts[0].Recv(ctx, 1, 5, make([]byte, 8)) }()
	go func() { errc <- ts[2].Recv(ctx, 1, 5, make([]byte, 8)) }()
	go func() { errc <- ts[1].Recv(ctx, 0, 6, make([]byte, 8)) }() // pending on the aborting rank
	time.Sleep(50 * time.Millisecond)
	cause := errors.New("loss is NaN")
	start := time.Now()
	ts[1].Abort(cause)
	for i := 0; i < 3; i++ {
		err := <-errc
		switch {
		case errors.Is(err, cause):
			mustContain(t, err, "rank 1 aborted")
		case errors.Is(err, transport.ErrPeerLost):
			mustContain(t, err, "aborted", "loss is NaN")
		default:
			t.Errorf("want the cause or ErrPeerLost, got %v", err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("abort took %v to reach the peers", d)
	}
	// Future operations fail too, on both sides.
	if err := ts[1].Send(ctx, 0, 1, []byte("x")); !errors.Is(err, cause) {
		t.Errorf("send after abort: %v", err)
	}
	if err := ts[0].Send(ctx, 1, 1, []byte("x")); !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("send to an aborted peer: %v", err)
	}
	// Ranks 0 and 2 still talk to each other.
	if err := ts[0].Send(ctx, 2, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := ts[2].Recv(ctx, 0, 1, make([]byte, 1)); err != nil {
		t.Fatal(err)
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

func TestCloseFailsPendingAndReportsClosedToPeers(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 10*time.Second)
	local := make(chan error, 1)
	remote := make(chan error, 1)
	go func() { local <- ts[0].Recv(ctx, 1, 1, make([]byte, 8)) }()
	go func() { remote <- ts[1].Recv(ctx, 0, 1, make([]byte, 8)) }()
	time.Sleep(50 * time.Millisecond)
	ts[0].Close()
	if err := <-local; !errors.Is(err, transport.ErrClosed) {
		t.Errorf("pending op on the closed side: want ErrClosed, got %v", err)
	}
	err := <-remote
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("pending op on the peer: want ErrPeerLost, got %v", err)
	}
	mustContain(t, err, "closed its transport")
	if err := ts[0].Send(ctx, 1, 1, nil); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("send after close: want ErrClosed, got %v", err)
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

func TestCloseAfterAbortAndTwice(t *testing.T) {
	ts := connectAll(t, 2, nil)
	ts[0].Abort(errors.New("stop"))
	ts[0].Abort(errors.New("again")) // no effect
	if err := ts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Close(); err != nil {
		t.Fatal(err)
	}
	err := ts[0].Send(context.Background(), 1, 1, nil)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("stop")) {
		t.Fatalf("after abort then close, ops report the abort: %v", err)
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

func TestLargeMessagesReceivedOutOfOrder(t *testing.T) {
	for _, path := range dataPaths {
		t.Run(path.name, func(t *testing.T) { testLargeMessagesReceivedOutOfOrder(t, path.backend) })
	}
}

func testLargeMessagesReceivedOutOfOrder(t *testing.T, b Backend) {
	// The reader leaves a large payload in the socket briefly, hoping for its
	// Recv; a Recv for a later message must still get through.
	ts := connectAllWith(t, func(int) Backend { return b }, 2, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	const size = 1 << 20
	for tag := 1; tag <= 3; tag++ {
		if err := ts[0].Send(ctx, 1, transport.Tag(tag), payload(tag, size)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []int{3, 1, 2} {
		buf := make([]byte, size)
		if err := ts[1].Recv(ctx, 0, transport.Tag(tag), buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, payload(tag, size)) {
			t.Fatalf("tag %d: payload corrupted", tag)
		}
	}
}
