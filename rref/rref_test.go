package rref

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/rpctest"
	"github.com/tandemml/tandem/rpc"
	"gorgonia.org/tensor"
)

// Counter is a value that lives on an owner and is used through Call.
type Counter struct {
	mu sync.Mutex
	N  int
}

func (c *Counter) Add(k int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.N += k
	return c.N
}

func (c *Counter) Get(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, errors.New("no context")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.N, nil
}

func (c *Counter) Fail() error { return errors.New("counter refuses") }

// holder keeps references that other workers send, per worker.
type holder struct {
	mu   sync.Mutex
	refs map[string]*RRef[*tensor.Dense]
}

func setup(h map[int]*holder) func(reg *rpc.Registry) {
	return func(reg *rpc.Registry) {
		must(rpc.Register(reg, "ones", func(ctx context.Context, n int) (*tensor.Dense, error) {
			return tensor.New(tensor.WithShape(n), tensor.WithBacking(ones(n))), nil
		}))
		must(rpc.Register(reg, "slow", func(ctx context.Context, d time.Duration) (*tensor.Dense, error) {
			time.Sleep(d)
			return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{7})), nil
		}))
		must(rpc.Register(reg, "bad", func(ctx context.Context, _ struct{}) (*tensor.Dense, error) {
			return nil, errors.New("cannot make it")
		}))
		must(rpc.Register(reg, "counter", func(ctx context.Context, start int) (*Counter, error) {
			return &Counter{N: start}, nil
		}))
		// keep stores a reference sent by another worker and returns the sum
		// of the value it fetches through it.
		must(rpc.Register(reg, "keep", func(ctx context.Context, ref *RRef[*tensor.Dense]) (float32, error) {
			a := rpc.AgentFromContext(ctx)
			hh := h[a.Self().ID]
			hh.mu.Lock()
			hh.refs[ref.ID().String()] = ref
			hh.mu.Unlock()
			v, err := ref.ToHere(ctx)
			if err != nil {
				return 0, err
			}
			return sum(v), nil
		}))
		must(rpc.Register(reg, "drop", func(ctx context.Context, id string) (struct{}, error) {
			a := rpc.AgentFromContext(ctx)
			hh := h[a.Self().ID]
			hh.mu.Lock()
			ref := hh.refs[id]
			delete(hh.refs, id)
			hh.mu.Unlock()
			if ref == nil {
				return struct{}{}, errors.New("no such ref " + id)
			}
			return struct{}{}, ref.Release(ctx)
		}))
		must(rpc.Register(reg, "isowner", func(ctx context.Context, ref *RRef[*tensor.Dense]) (bool, error) {
			if _, err := ref.ToHere(ctx); err != nil {
				return false, err
			}
			if _, err := ref.LocalValue(); err != nil && ref.IsOwner() {
				return false, err
			}
			return ref.IsOwner(), nil
		}))
		must(rpc.Register(reg, "make", func(ctx context.Context, n int) (*RRef[*tensor.Dense], error) {
			return LocalRRef(rpc.AgentFromContext(ctx), tensor.New(tensor.WithShape(n), tensor.WithBacking(ones(n))))
		}))
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func ones(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	return x
}

func sum(t *tensor.Dense) float32 {
	var s float32
	for _, v := range t.Data().([]float32) {
		s += v
	}
	return s
}

func holders(n int) map[int]*holder {
	h := map[int]*holder{}
	for i := 0; i < n; i++ {
		h[i] = &holder{refs: map[string]*RRef[*tensor.Dense]{}}
	}
	return h
}

func TestRemoteToHereRelease(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 5)
	if err != nil {
		t.Fatal(err)
	}
	if ref.IsOwner() || ref.Owner().Name != "w1" {
		t.Fatalf("user ref: owner=%v isOwner=%v", ref.Owner(), ref.IsOwner())
	}
	if _, err := ref.LocalValue(); !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Fatalf("LocalValue on a user: %v", err)
	}
	v, err := ref.ToHere(ctx)
	if err != nil || sum(v) != 5 {
		t.Fatalf("ToHere: %v %v", v, err)
	}
	if err := ref.WaitConfirmed(ctx); err != nil || !ref.ConfirmedByOwner() {
		t.Fatalf("confirmed: %v %v", ref.ConfirmedByOwner(), err)
	}
	if n := forks(agents[1], ref.ID()); n != 1 {
		t.Fatalf("owner has %d forks, want 1", n)
	}
	if err := ref.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ref.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	rpctest.Eventually(t, "the owner deletes the value", func() bool { return OwnedCount(agents[1]) == 0 })
	if _, err := ref.ToHere(ctx); !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Fatalf("ToHere after release: %v", err)
	}
	for i, err := range rpctest.ShutdownAll(agents) {
		if err != nil {
			t.Errorf("shutdown %d: %v", i, err)
		}
	}
}

func TestForkToThirdWorker(t *testing.T) {
	h := holders(3)
	agents := startGroup(t, 3, setup(h))
	ctx := context.Background()
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 4)
	if err != nil {
		t.Fatal(err)
	}
	// w0 passes its user reference to w2: a fork from a user, which the
	// owner must confirm.
	s, err := rpc.Sync[float32](ctx, agents[0], "w2", "keep", ref)
	if err != nil || s != 4 {
		t.Fatalf("keep on w2: %v %v", s, err)
	}
	rpctest.Eventually(t, "the owner registers w2's fork", func() bool { return forks(agents[1], ref.ID()) == 2 })
	h[2].mu.Lock()
	var childRef *RRef[*tensor.Dense]
	for _, r := range h[2].refs {
		childRef = r
	}
	h[2].mu.Unlock()
	if err := childRef.WaitConfirmed(ctx); err != nil || !childRef.ConfirmedByOwner() {
		t.Fatalf("child not confirmed: %v", err)
	}
	rpctest.Eventually(t, "w0's pending child is accepted", func() bool {
		rc := mustContext(t, agents[0])
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.children) == 0
	})
	// w0 releases: w2 still holds the value alive.
	if err := ref.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rpctest.Eventually(t, "w0's fork deleted", func() bool { return forks(agents[1], ref.ID()) == 1 })
	if got := OwnedCount(agents[1]); got != 1 {
		t.Fatalf("owner holds %d values after the first release, want 1", got)
	}
	if v, err := childRef.ToHere(ctx); err != nil || sum(v) != 4 {
		t.Fatalf("w2's ToHere after w0 released: %v %v", v, err)
	}
	// w2 releases: the owner deletes the value.
	if _, err := rpc.Sync[struct{}](ctx, agents[0], "w2", "drop", ref.ID().String()); err != nil {
		t.Fatal(err)
	}
	rpctest.Eventually(t, "the owner deletes the value", func() bool { return OwnedCount(agents[1]) == 0 })

	// A reference received as a result stays valid through collections
	// while it is in use (its cleanup belongs to the handle the caller got).
	got, err := rpc.Sync[*RRef[*tensor.Dense]](ctx, agents[0], "w1", "make", 2)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if v, err := got.ToHere(ctx); err != nil || sum(v) != 2 {
		t.Fatalf("ToHere after GC: %v %v", v, err)
	}
	if err := got.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A user passing the reference back to its owner: the owner gets its
	// own reference.
	ref2, _ := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 2)
	isOwner, err := rpc.Sync[bool](ctx, agents[0], "w1", "isowner", ref2)
	if err != nil || !isOwner {
		t.Fatalf("owner receiving its own ref: %v %v", isOwner, err)
	}
	if err := ref2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rpctest.Eventually(t, "the owner deletes the second value", func() bool { return OwnedCount(agents[1]) == 0 })
	for i, err := range rpctest.ShutdownAll(agents) {
		if err != nil {
			t.Errorf("shutdown %d: %v", i, err)
		}
	}
}

func TestOwnerSendsReferences(t *testing.T) {
	h := holders(3)
	agents := startGroup(t, 3, setup(h))
	ctx := context.Background()
	// A reference returned as a result: w1 makes a LocalRRef and returns it.
	ref, err := rpc.Sync[*RRef[*tensor.Dense]](ctx, agents[0], "w1", "make", 3)
	if err != nil {
		t.Fatal(err)
	}
	if ref.IsOwner() || ref.Owner().Name != "w1" || !ref.ConfirmedByOwner() {
		t.Fatalf("returned ref: %v owner=%v confirmed=%v", ref, ref.Owner(), ref.ConfirmedByOwner())
	}
	if v, err := ref.ToHere(ctx); err != nil || sum(v) != 3 {
		t.Fatalf("ToHere: %v %v", v, err)
	}
	// An owner reference on w0 sent to w2.
	local, err := LocalRRef(agents[0], tensor.New(tensor.WithShape(6), tensor.WithBacking(ones(6))))
	if err != nil {
		t.Fatal(err)
	}
	if !local.IsOwner() {
		t.Fatal("LocalRRef is not an owner reference")
	}
	if v, err := local.LocalValue(); err != nil || sum(v) != 6 {
		t.Fatalf("LocalValue: %v %v", v, err)
	}
	if s, err := rpc.Sync[float32](ctx, agents[0], "w2", "keep", local); err != nil || s != 6 {
		t.Fatalf("keep: %v %v", s, err)
	}
	if n := forks(agents[0], local.ID()); n != 1 {
		t.Fatalf("w0 has %d forks of its value, want 1", n)
	}
	if _, err := rpc.Sync[struct{}](ctx, agents[0], "w2", "drop", local.ID().String()); err != nil {
		t.Fatal(err)
	}
	rpctest.Eventually(t, "w0 unlists its value", func() bool { return OwnedCount(agents[0]) == 0 })
	// The owner's handle still works after every user released.
	if v, err := local.ToHere(ctx); err != nil || sum(v) != 6 {
		t.Fatalf("owner ToHere: %v %v", v, err)
	}
	if err := ref.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Remote to oneself yields an owner reference.
	self, err := Remote[*tensor.Dense](ctx, agents[0], "w0", "ones", 2)
	if err != nil || !self.IsOwner() {
		t.Fatalf("self remote: %v %v", self, err)
	}
	if v, err := self.ToHere(ctx); err != nil || sum(v) != 2 {
		t.Fatalf("self ToHere: %v %v", v, err)
	}
	for i, err := range rpctest.ShutdownAll(agents) {
		if err != nil {
			t.Errorf("shutdown %d: %v", i, err)
		}
	}
}

func TestCall(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*Counter](ctx, agents[0], "w1", "counter", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Release(ctx)
	if n, err := Call[int](ctx, ref, "Add", 5); err != nil || n != 15 {
		t.Fatalf("Add: %v %v", n, err)
	}
	if n, err := Call[int](ctx, ref, "Get"); err != nil || n != 15 {
		t.Fatalf("Get: %v %v", n, err)
	}
	if _, err := Call[struct{}](ctx, ref, "Fail"); !errors.Is(err, rpc.ErrRemote) || !strings.Contains(err.Error(), "counter refuses") {
		t.Fatalf("Fail: %v", err)
	}
	_, err = Call[int](ctx, ref, "Ad", 1)
	if err == nil || !strings.Contains(err.Error(), "Add, Fail, Get") {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := Call[int](ctx, ref, "Add", "five"); !errors.Is(err, rpc.ErrWrongType) {
		t.Fatalf("wrong argument type: %v", err)
	}
	if _, err := Call[int](ctx, ref, "Add"); !errors.Is(err, rpc.ErrWrongType) {
		t.Fatalf("missing argument: %v", err)
	}
	// The value itself travels too (exported fields).
	c, err := ref.ToHere(ctx)
	if err != nil || c.N != 15 {
		t.Fatalf("ToHere counter: %+v %v", c, err)
	}
	// On the owner, Call runs locally.
	local, err := LocalRRef(agents[0], &Counter{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := Call[int](ctx, local, "Add", 1); err != nil || n != 2 {
		t.Fatalf("local Add: %v %v", n, err)
	}
}

func TestCreationErrors(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "bad", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ref.ToHere(ctx); !errors.Is(err, rpc.ErrRemote) || !strings.Contains(err.Error(), "cannot make it") {
		t.Fatalf("ToHere of a failed creation: %v", err)
	}
	if err := ref.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ref, err = Remote[*tensor.Dense](ctx, agents[0], "w1", "nosuch", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ref.ToHere(ctx); !errors.Is(err, rpc.ErrUnknownFunction) {
		t.Fatalf("ToHere of an unknown function: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("unknown function took %v to surface", time.Since(start))
	}
	ref.Release(ctx)
	ref3, err := Remote[*Counter](ctx, agents[0], "w1", "ones", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ref3.ToHere(ctx); !errors.Is(err, rpc.ErrWrongType) {
		t.Fatalf("Remote with the wrong type: %v", err)
	}
	ref3.Release(ctx)
	rpctest.Eventually(t, "nothing owned", func() bool { return OwnedCount(agents[1]) == 0 })
}

func TestLeakReportedAtShutdown(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ref.ToHere(ctx); err != nil {
		t.Fatal(err)
	}
	errs := rpctest.ShutdownAll(agents)
	if !errors.Is(errs[0], ErrLeaked) || !strings.Contains(errs[0].Error(), "1 user reference") {
		t.Fatalf("w0's shutdown: %v", errs[0])
	}
	if errs[1] != nil {
		t.Fatalf("w1's shutdown: %v", errs[1])
	}
	// The graceful shutdown released the leak, so the owner freed the value.
	if n := OwnedCount(agents[1]); n != 0 {
		t.Fatalf("owner still holds %d values", n)
	}
	runtime.KeepAlive(ref)
}

func TestOwnerDeadToHereFails(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "slow", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.WaitConfirmed(ctx); err != nil {
		t.Fatal(err)
	}
	agents[1].Close() // the owner dies
	start := time.Now()
	_, err = ref.ToHere(ctx, rpc.WithTimeout(5*time.Second))
	if !errors.Is(err, rpc.ErrPeerLost) && !errors.Is(err, rpc.ErrTimeout) {
		t.Fatalf("ToHere from a dead owner: %v", err)
	}
	if time.Since(start) > 6*time.Second {
		t.Fatalf("ToHere took %v", time.Since(start))
	}
	t.Logf("ToHere from a dead owner: %v (%v)", err, time.Since(start))
}

func TestCollectedReferenceIsReleased(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	func() {
		ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 3)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ref.ToHere(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	rpctest.Eventually(t, "the cleanup releases the collected reference", func() bool {
		runtime.GC()
		return OwnedCount(agents[1]) == 0 && UserCount(agents[0]) == 0
	})
}

func TestUnsentForkIsUndone(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)), rpc.WithMaxMessageSize(1<<20))
	ctx := context.Background()
	big := tensor.New(tensor.WithShape(1<<19), tensor.WithBacking(make([]float32, 1<<19)))
	type withTensor struct {
		R *RRef[*tensor.Dense]
		T *tensor.Dense
	}
	// A call that fails after the reference was encoded (the message is too
	// large): the fork the owner registered for the receiver is undone.
	local, err := LocalRRef(agents[0], tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{1})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rpc.Sync[float32](ctx, agents[0], "w1", "keep", withTensor{local, big}); !errors.Is(err, rpc.ErrTooLarge) {
		t.Fatalf("oversized call: %v", err)
	}
	if n := forks(agents[0], local.ID()); n > 0 {
		t.Fatalf("%d forks left after a call that never went", n)
	}
	// The same with a user reference: no pending child stays behind, and
	// the release goes out at once.
	ref, err := Remote[*tensor.Dense](ctx, agents[0], "w1", "ones", 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.WaitConfirmed(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rpc.Sync[float32](ctx, agents[0], "w1", "keep", withTensor{ref, big}); !errors.Is(err, rpc.ErrTooLarge) {
		t.Fatalf("oversized call: %v", err)
	}
	rc := mustContext(t, agents[0])
	rc.mu.Lock()
	pending := len(rc.children)
	rc.mu.Unlock()
	if pending != 0 {
		t.Fatalf("%d pending children after a call that never went", pending)
	}
	if err := ref.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rpctest.Eventually(t, "the owner frees the value", func() bool { return OwnedCount(agents[1]) == 0 })
}
