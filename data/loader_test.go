package data

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// indexSet is a data set whose example i has features [i, -i] and label i%10.
func indexSet(t testing.TB, n int) *InMemory {
	x := make([]float32, 2*n)
	y := make([]int, n)
	for i := 0; i < n; i++ {
		x[2*i], x[2*i+1], y[i] = float32(i), -float32(i), i%10
	}
	ds, err := NewInMemory([]int{2}, x, y)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// collect runs one epoch and returns its batches.
func collect(t *testing.T, l *Loader, epoch int) []*Batch {
	t.Helper()
	var out []*Batch
	for b, err := range l.Epoch(context.Background(), epoch) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func checkBatch(t *testing.T, b *Batch) {
	t.Helper()
	x := b.X.Data().([]float32)
	if !b.X.Shape().Eq(tensor.Shape{b.Size(), 2}) || !b.Y.Shape().Eq(tensor.Shape{b.Size()}) {
		t.Fatalf("batch %d: X %v, Y %v for %d examples", b.Index, b.X.Shape(), b.Y.Shape(), b.Size())
	}
	for r, i := range b.Indices {
		if x[2*r] != float32(i) || x[2*r+1] != -float32(i) || b.Labels()[r] != int64(i%10) {
			t.Fatalf("batch %d row %d: features %v label %d, want example %d", b.Index, r, x[2*r:2*r+2], b.Labels()[r], i)
		}
	}
}

func TestLoaderBatches(t *testing.T) {
	testkit.CheckLeaks(t)
	ds := indexSet(t, 10)
	for _, c := range []struct {
		drop  bool
		sizes []int
	}{{false, []int{4, 4, 2}}, {true, []int{4, 4}}} {
		var opts []Option
		if c.drop {
			opts = append(opts, DropLast())
		}
		l, err := NewLoader(ds, 4, opts...)
		if err != nil {
			t.Fatal(err)
		}
		bs := collect(t, l, 0)
		if l.Len() != len(c.sizes) || len(bs) != len(c.sizes) {
			t.Fatalf("drop=%v: %d batches (Len %d), want %d", c.drop, len(bs), l.Len(), len(c.sizes))
		}
		next := 0
		for k, b := range bs {
			checkBatch(t, b)
			if b.Index != k || b.Size() != c.sizes[k] || b.Indices[0] != next {
				t.Fatalf("drop=%v batch %d: index %d size %d first %d", c.drop, k, b.Index, b.Size(), b.Indices[0])
			}
			next += b.Size()
		}
	}
}

func TestLoaderShuffleAndWorkers(t *testing.T) {
	testkit.CheckLeaks(t)
	ds := indexSet(t, 103)
	orderOf := func(l *Loader, epoch int) []int {
		var o []int
		for _, b := range collect(t, l, epoch) {
			checkBatch(t, b)
			o = append(o, b.Indices...)
		}
		return o
	}
	one, _ := NewLoader(ds, 8, Shuffle(5))
	many, _ := NewLoader(ds, 8, Shuffle(5), Workers(3), Prefetch(5))
	e1, e2 := orderOf(one, 1), orderOf(one, 2)
	if !slices.Equal(e1, orderOf(many, 1)) {
		t.Fatal("three workers delivered another order than one worker")
	}
	if slices.Equal(e1, e2) {
		t.Fatal("shuffled epochs 1 and 2 have the same order")
	}
	sorted := slices.Clone(e1)
	slices.Sort(sorted)
	if !slices.Equal(sorted, seq(103)) {
		t.Fatal("a shuffled epoch does not visit every example once")
	}
	if !slices.Equal(e1, permutation(103, 5+1)) {
		t.Fatal("the loader's shuffle is not the permutation keyed by seed+epoch")
	}
}

func TestLoaderWithDistributedSampler(t *testing.T) {
	testkit.CheckLeaks(t)
	ds := indexSet(t, 50)
	var all []int
	for r := 0; r < 3; r++ {
		s, _ := NewDistributedSampler(ds.Len(), 3, r, Shuffle(9))
		l, err := NewLoader(ds, 7, WithSampler(s), Workers(2))
		if err != nil {
			t.Fatal(err)
		}
		var mine []int
		for _, b := range collect(t, l, 4) {
			checkBatch(t, b)
			mine = append(mine, b.Indices...)
		}
		if !slices.Equal(mine, s.Indices(4)) {
			t.Fatalf("rank %d: loader order %v, sampler %v", r, mine, s.Indices(4))
		}
		all = append(all, mine...)
	}
	if len(all) != 51 { // 50 padded to 51
		t.Fatalf("%d indices over 3 ranks, want 51", len(all))
	}
}

func TestLoaderFloat64(t *testing.T) {
	l, _ := NewLoader(indexSet(t, 3), 3, Dtype(tensor.Float64))
	b := collect(t, l, 0)[0]
	if b.X.Dtype() != tensor.Float64 || b.X.Float64s()[4] != 2 {
		t.Fatalf("float64 batch: %v %v", b.X.Dtype(), b.X.Data())
	}
}

// gated is a data set whose Get blocks until the gate is opened, counting
// calls.
type gated struct {
	*InMemory
	calls atomic.Int64
	gate  chan struct{}
}

func (g *gated) Get(i int, x []float32) (int, error) {
	g.calls.Add(1)
	<-g.gate
	return g.InMemory.Get(i, x)
}

// waitFor polls cond for up to 10 s (a guard against hangs, not a timing
// assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLoaderPrefetchIsBounded(t *testing.T) {
	testkit.CheckLeaks(t)
	g := &gated{InMemory: indexSet(t, 100), gate: make(chan struct{})}
	close(g.gate)
	l, _ := NewLoader(g, 1, Prefetch(3))
	it := l.Iterate(context.Background(), 0)
	defer it.Close()
	checkPrefetchBounded(t, &g.calls, func() {
		if !it.Next() || it.Batch().Indices[0] != 0 {
			t.Fatal("first batch missing")
		}
	})
}

// checkPrefetchBounded checks a loader with Prefetch(3) and batches of one:
// with nobody consuming, the worker fills the 3 slots and builds one more
// batch, which it cannot deliver; after read takes the first batch, it
// builds exactly one more. calls counts the batches built.
func checkPrefetchBounded(t *testing.T, calls *atomic.Int64, read func()) {
	t.Helper()
	waitFor(t, "4 batches built", func() bool { return calls.Load() >= 4 })
	time.Sleep(50 * time.Millisecond)
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d batches built ahead with Prefetch(3), want 4", n)
	}
	read()
	waitFor(t, "one more batch after a read", func() bool { return calls.Load() >= 5 })
	time.Sleep(50 * time.Millisecond)
	if n := calls.Load(); n != 5 {
		t.Fatalf("%d batches built after one read, want 5", n)
	}
}

func TestLoaderCancel(t *testing.T) {
	testkit.CheckLeaks(t)
	g := &gated{InMemory: indexSet(t, 100), gate: make(chan struct{})} // never opens
	l, _ := NewLoader(g, 10, Workers(3))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		waitFor(t, "workers started", func() bool { return g.calls.Load() >= 3 })
		cancel()
		close(g.gate) // let the blocked Gets return so the workers can see ctx
	}()
	n := 0
	var last error
	for b, err := range l.Epoch(ctx, 0) {
		if err != nil {
			last = err
			break
		}
		_ = b
		n++
	}
	if !errors.Is(last, context.Canceled) {
		t.Fatalf("after cancel: %d batches then %v, want an error wrapping context.Canceled", n, last)
	}
}

func TestLoaderDeadline(t *testing.T) {
	testkit.CheckLeaks(t)
	g := &gated{InMemory: indexSet(t, 100), gate: make(chan struct{})}
	l, _ := NewLoader(g, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	it := l.Iterate(ctx, 0)
	if it.Next() {
		t.Fatal("got a batch from a data set that never answers")
	}
	if err := it.Err(); !errors.Is(err, errs.Timeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want it to wrap errs.Timeout and context.DeadlineExceeded", err)
	}
	close(g.gate) // let the worker's Get return so that Close can wait for it
	it.Close()
}

func TestLoaderBreakAndClose(t *testing.T) {
	testkit.CheckLeaks(t)
	l, _ := NewLoader(indexSet(t, 1000), 3, Workers(4), Prefetch(8))
	for b, err := range l.Epoch(context.Background(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		if b.Index == 2 {
			break
		}
	}
	// Close from another goroutine while the consumer is reading.
	it := l.Iterate(context.Background(), 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); it.Close() }()
	wg.Wait()
	for it.Next() {
	}
	if it.Err() != nil {
		t.Fatalf("Err after Close = %v, want nil", it.Err())
	}
	it.Close() // idempotent
}

// failing is a data set whose example bad cannot be read.
type failing struct {
	*InMemory
	bad int
}

var errBroken = errors.New("broken example")

func (f failing) Get(i int, x []float32) (int, error) {
	if i == f.bad {
		return 0, errBroken
	}
	return f.InMemory.Get(i, x)
}

func TestLoaderDatasetError(t *testing.T) {
	testkit.CheckLeaks(t)
	l, _ := NewLoader(failing{indexSet(t, 40), 17}, 5, Workers(2))
	var got []int
	var last error
	errs := 0
	for b, err := range l.Epoch(context.Background(), 0) {
		if err != nil {
			last = err
			errs++
			continue
		}
		got = append(got, b.Index)
	}
	if !errors.Is(last, errBroken) || errs != 1 || !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("batches %v, %d errors, last %v; want batches 0-2 then the error of example 17", got, errs, last)
	}
	if want := "example 17"; !strings.Contains(last.Error(), want) {
		t.Fatalf("error %q does not name %q", last, want)
	}
}

func TestLoaderConcurrentEpochs(t *testing.T) {
	testkit.CheckLeaks(t)
	l, _ := NewLoader(indexSet(t, 200), 16, Shuffle(1), Workers(2))
	var wg sync.WaitGroup
	for e := 0; e < 4; e++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for b, err := range l.Epoch(context.Background(), e) {
				if err != nil {
					t.Error(err)
					return
				}
				n += b.Size()
			}
			if n != 200 {
				t.Errorf("epoch %d: %d examples", e, n)
			}
		}()
	}
	wg.Wait()
}

func TestLoaderArguments(t *testing.T) {
	ds := indexSet(t, 4)
	s, _ := NewSequentialSampler(4)
	for name, err := range map[string]error{
		"batch 0":           second(NewLoader(ds, 0)),
		"nil data set":      second(NewLoader(nil, 2)),
		"prefetch 0":        second(NewLoader(ds, 2, Prefetch(0))),
		"workers 0":         second(NewLoader(ds, 2, Workers(0))),
		"int dtype":         second(NewLoader(ds, 2, Dtype(tensor.Int))),
		"sampler + shuffle": second(NewLoader(ds, 2, WithSampler(s), Shuffle(1))),
		"nil sampler":       second(NewLoader(ds, 2, WithSampler(nil))),
		"image option":      second(NewLoader(ds, 2, Flatten())),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := NewInMemory([]int{3}, make([]float32, 5), []int{1, 2}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewInMemory with too few values: %v", err)
	}
}

func BenchmarkLoaderEpoch(b *testing.B) {
	x := make([]float32, 60000*784)
	ds, _ := NewInMemory([]int{784}, x, make([]int, 60000))
	l, _ := NewLoader(ds, 64, Shuffle(0), Prefetch(4))
	b.SetBytes(int64(len(x) * 4))
	for i := 0; i < b.N; i++ {
		for _, err := range l.Epoch(context.Background(), i) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
