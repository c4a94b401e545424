package rpc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/recvbuf"
)

// sameHost makes a first call from a to w1 and reports whether that
// connection receives by reference (same-host copies), the path on which
// lent memory is used; elsewhere replies arrive in new memory.
func sameHost(t *testing.T, a *Agent) bool {
	t.Helper()
	if _, err := Sync[*tensor.Dense](context.Background(), a, "w1", "echo", filled(cmaThreshold/4, 0)); err != nil {
		t.Fatal(err)
	}
	c := a.peers[1].cur.Load()
	byRef := c != nil && c.recvByRef
	if !byRef {
		t.Log("replies come through the socket here: checking that lent memory is left alone")
	}
	return byRef
}

func filled(n int, v float32) *tensor.Dense {
	d := make([]float32, n)
	for i := range d {
		d[i] = v + float32(i%7)
	}
	return dense([]int{n}, d)
}

func dataAddr(t *tensor.Dense) uintptr { return uintptr(unsafe.Pointer(&t.Float32s()[0])) }

// TestResultInto: a reply is received into the tensor the caller lent, which
// the result then is; a tensor of another shape is not used.
func TestResultInto(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "same-host", false: "socket"}[on], func(t *testing.T) { testResultInto(t, on) })
	}
}

func testResultInto(t *testing.T, sameHostCopy bool) {
	type pair struct{ A, B *tensor.Dense }
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		registerBasics(rank, reg)
		must(Register(reg, "twice", func(ctx context.Context, x *tensor.Dense) (pair, error) {
			return pair{x, x.Clone().(*tensor.Dense)}, nil
		}))
	}, WithSameHostCopy(sameHostCopy))
	ctx := context.Background()
	byRef := sameHost(t, agents[0])
	n := cmaThreshold / 4 * 2
	x := filled(n, 3)
	y := filled(n, -1)
	yBefore := append([]float32(nil), y.Float32s()...)
	got, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x, WithResultInto(y))
	if err != nil {
		t.Fatal(err)
	}
	if !sameTensor(x, got) {
		t.Fatal("the echo came back changed")
	}
	if byRef != (got == y) {
		t.Fatalf("result in the lent tensor: %v, want %v (the reply came by reference: %v)", got == y, byRef, byRef)
	}
	if !byRef {
		for i, v := range y.Float32s() {
			if v != yBefore[i] {
				t.Fatalf("a reply through the socket changed the lent tensor at %d", i)
			}
		}
		return
	}
	// Another shape: new memory, the lent tensor untouched.
	other := filled(n/2, 9)
	before := append([]float32(nil), other.Float32s()...)
	got, err = Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x, WithResultInto(other))
	if err != nil {
		t.Fatal(err)
	}
	if got == other || !sameTensor(x, got) {
		t.Fatal("a reply of another shape went into the lent tensor, or came back wrong")
	}
	for i, v := range other.Float32s() {
		if v != before[i] {
			t.Fatalf("the lent tensor of another shape changed at %d", i)
		}
	}
	// One tensor lent twice receives the first of two.
	pr, err := Sync[pair](ctx, agents[0], "w1", "twice", x, WithResultInto(y, y))
	if err != nil {
		t.Fatal(err)
	}
	if pr.A != y || pr.B == y || !sameTensor(x, pr.A) || !sameTensor(x, pr.B) {
		t.Fatal("a tensor lent twice received both results, or they came back wrong")
	}
	// A nil tensor in the list is no offer.
	if got, err = Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x, WithResultInto(nil)); err != nil || !sameTensor(x, got) {
		t.Fatalf("echo with a nil lent tensor: %v", err)
	}
}

// TestResultIntoLateReply: once a call has timed out, its late reply must
// not be written into the tensor the caller lent, which is the caller's
// again.
func TestResultIntoLateReply(t *testing.T) {
	release := make(chan struct{})
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		registerBasics(rank, reg)
		must(Register(reg, "slow_echo", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			<-release
			return x, nil
		}))
	})
	ctx := context.Background()
	sameHost(t, agents[0])
	n := cmaThreshold / 4 * 2
	y := filled(n, -5)
	want := append([]float32(nil), y.Float32s()...)
	_, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "slow_echo", filled(n, 1), WithResultInto(y), WithTimeout(100*time.Millisecond))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	close(release)
	// The late reply arrives (or is dropped) meanwhile; then the
	// connection still serves.
	if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", filled(n, 2)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for i, v := range y.Float32s() {
		if v != want[i] {
			t.Fatalf("a late reply wrote into the lent tensor at %d: %v", i, v)
		}
	}
}

// TestResultIntoConcurrent: concurrent calls, each lending its own tensor,
// get their own replies (run with -race).
func TestResultIntoConcurrent(t *testing.T) {
	agents := startGroup(t, 2, registerBasics)
	ctx := context.Background()
	sameHost(t, agents[0])
	n := cmaThreshold / 4
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var y *tensor.Dense
			for i := 0; i < 20; i++ {
				x := filled(n, float32(100*g+i))
				var err error
				y, err = Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x, WithResultInto(y))
				if err != nil {
					errs <- err
					return
				}
				if !sameTensor(x, y) {
					errs <- errors.New("a reply went to another call's tensor")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitReleased waits until the receive buffer whose data starts at addr is back
// on its free list (at most 5 s).
func waitReleased(t *testing.T, addr uint64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if recvbuf.Free(uintptr(addr)) {
			return
		}
	}
	t.Fatalf("the buffer at %#x was not handed back within 5 s", addr)
}

// TestReuseArgMemory: the argument memory of a function registered with
// ReuseArgMemory serves the next call's argument at once; a function
// without it keeps what it was given intact.
func TestReuseArgMemory(t *testing.T) {
	var mu sync.Mutex
	var kept []*tensor.Dense
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		registerBasics(rank, reg)
		must(Register(reg, "addr_reuse", func(ctx context.Context, x *tensor.Dense) (uint64, error) {
			return uint64(dataAddr(x)), nil
		}, ReuseArgMemory()))
		must(Register(reg, "addr_keep", func(ctx context.Context, x *tensor.Dense) (uint64, error) {
			mu.Lock()
			kept = append(kept, x)
			mu.Unlock()
			return uint64(dataAddr(x)), nil
		}))
		must(Register(reg, "echo_reuse", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			return x, nil
		}, ReuseArgMemory()))
	})
	ctx := context.Background()
	n := (256 << 10) / 4 * 3 // 768 KiB of float32: a recycled size (recvbuf), a class of its own in this test binary
	first, err := Sync[uint64](ctx, agents[0], "w1", "addr_reuse", filled(n, 1))
	if err != nil {
		t.Fatal(err)
	}
	// The callee hands the argument's memory back once its reply has gone,
	// which may be a moment after the reply arrives here.
	waitReleased(t, first)
	second, err := Sync[uint64](ctx, agents[0], "w1", "addr_reuse", filled(n, 2))
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatalf("the second argument got memory %#x, not the first's %#x", second, first)
	}
	// Kept arguments are never reused.
	seen := map[uint64]bool{}
	for i := 0; i < 3; i++ {
		a, err := Sync[uint64](ctx, agents[0], "w1", "addr_keep", filled(n, float32(10*i)))
		if err != nil {
			t.Fatal(err)
		}
		if seen[a] {
			t.Fatalf("a kept argument's memory %#x was handed out again", a)
		}
		seen[a] = true
	}
	// Returning the argument: it is sent before its memory serves again.
	for i := 0; i < 5; i++ {
		x := filled(n, float32(i))
		y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo_reuse", x)
		if err != nil {
			t.Fatal(err)
		}
		if !sameTensor(x, y) {
			t.Fatalf("call %d: the echo of a reused argument came back changed", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, k := range kept {
		if !sameTensor(k, filled(n, float32(10*i))) {
			t.Fatalf("kept argument %d changed", i)
		}
	}
}
