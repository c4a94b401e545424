package data

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// regressionSet has, for example i, a float64 input [i, 2i, 3i], a float32
// input [[i, -i], [0.5, i]], a float32 target i/2 and an int64 id 100+i.
func regressionSet(t testing.TB, n int) *TensorDataset {
	a := make([]float64, 3*n)
	b := make([]float32, 4*n)
	y := make([]float32, n)
	id := make([]int64, n)
	for i := range n {
		a[3*i], a[3*i+1], a[3*i+2] = float64(i), float64(2*i), float64(3*i)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = float32(i), -float32(i), 0.5, float32(i)
		y[i], id[i] = float32(i)/2, int64(100+i)
	}
	ds, err := NewTensorDataset([]string{"a", "b", "y", "id"},
		tensor.New(tensor.WithShape(n, 3), tensor.WithBacking(a)),
		tensor.New(tensor.WithShape(n, 2, 2), tensor.WithBacking(b)),
		tensor.New(tensor.WithShape(n), tensor.WithBacking(y)),
		tensor.New(tensor.WithShape(n), tensor.WithBacking(id)))
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// checkRegressionBatch checks every tensor of b against the examples it
// names.
func checkRegressionBatch(t *testing.T, b *Batch) {
	t.Helper()
	n := b.Size()
	if !slices.Equal(b.Names, []string{"a", "b", "y", "id"}) || len(b.Tensors) != 4 {
		t.Fatalf("batch %d: names %v", b.Index, b.Names)
	}
	shapes := []tensor.Shape{{n, 3}, {n, 2, 2}, {n}, {n}}
	for f, s := range shapes {
		if !b.Tensors[f].Shape().Eq(s) {
			t.Fatalf("batch %d field %s: shape %v, want %v", b.Index, b.Names[f], b.Tensors[f].Shape(), s)
		}
	}
	if f := b.Feeds(); len(f) != 4 || f["y"] != b.Tensors[2] || f["id"] != b.Tensors[3] {
		t.Fatalf("batch %d: feeds %v", b.Index, f)
	}
	if b.X != b.Tensor("a") || b.Y != b.Tensor("b") || b.Tensor("nope") != nil {
		t.Fatalf("batch %d: X and Y are not the first two fields", b.Index)
	}
	a, bb := b.Tensor("a").Float64s(), b.Tensor("b").Float32s()
	y, id := b.Tensor("y").Float32s(), b.Tensor("id").Int64s()
	for r, i := range b.Indices {
		if !slices.Equal(a[3*r:3*r+3], []float64{float64(i), float64(2 * i), float64(3 * i)}) ||
			!slices.Equal(bb[4*r:4*r+4], []float32{float32(i), -float32(i), 0.5, float32(i)}) ||
			y[r] != float32(i)/2 || id[r] != int64(100+i) {
			t.Fatalf("batch %d row %d: a %v b %v y %v id %v, want example %d", b.Index, r, a[3*r:3*r+3], bb[4*r:4*r+4], y[r], id[r], i)
		}
	}
}

func TestTensorLoaderBatches(t *testing.T) {
	testkit.CheckLeaks(t)
	ds := regressionSet(t, 10)
	if ds.Len() != 10 || len(ds.Fields()) != 4 || !slices.Equal(ds.Fields()[1].Shape, []int{2, 2}) || ds.Fields()[3].Dtype != tensor.Int64 {
		t.Fatalf("fields %+v", ds.Fields())
	}
	l, err := NewTensorLoader(ds, 4)
	if err != nil {
		t.Fatal(err)
	}
	bs := collect(t, l, 0)
	if len(bs) != 3 || l.Len() != 3 || bs[2].Size() != 2 {
		t.Fatalf("%d batches (Len %d), last of %d, want 3 with 2 in the last", len(bs), l.Len(), bs[len(bs)-1].Size())
	}
	var seen []int
	for _, b := range bs {
		checkRegressionBatch(t, b)
		seen = append(seen, b.Indices...)
	}
	if !slices.Equal(seen, seq(10)) {
		t.Fatalf("sequential order %v", seen)
	}
	dl, _ := NewTensorLoader(ds, 4, DropLast(), Shuffle(3), Workers(3))
	if bs := collect(t, dl, 1); len(bs) != 2 || bs[1].Size() != 4 {
		t.Fatalf("DropLast: %d batches", len(bs))
	}
	// positional names, and a single field leaves Y nil
	pos, err := NewTensorDataset(nil, tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{1, 2, 3})))
	if err != nil {
		t.Fatal(err)
	}
	pl, _ := NewTensorLoader(pos, 2)
	b := collect(t, pl, 0)[0]
	if !slices.Equal(b.Names, []string{"0"}) || b.Y != nil || !slices.Equal(b.X.Float64s(), []float64{1, 2}) {
		t.Fatalf("positional batch: names %v Y %v X %v", b.Names, b.Y, b.X)
	}
	// a labelled Dataset's batches carry the same named tensors
	lb := collect(t, mustLoader(t, indexSet(t, 5), 5), 0)[0]
	if !slices.Equal(lb.Names, []string{"x", "y"}) || lb.Tensor("x") != lb.X || lb.Tensor("y") != lb.Y {
		t.Fatalf("labelled batch names %v", lb.Names)
	}
}

func mustLoader(t *testing.T, ds Dataset, bs int) *Loader {
	l, err := NewLoader(ds, bs)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The DistributedSampler shards a TensorSet exactly as it shards a Dataset:
// each rank gets its sampler's indices, batches carry those rows, and the
// ranks together cover the data set (padded to a multiple of the world).
func TestTensorLoaderDistributedSampler(t *testing.T) {
	testkit.CheckLeaks(t)
	ds := regressionSet(t, 50)
	const world, epoch = 3, 4
	var all []int
	for r := range world {
		s, err := NewDistributedSampler(ds.Len(), world, r, Shuffle(9))
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewTensorLoader(ds, 7, WithSampler(s), Workers(2), Prefetch(3))
		if err != nil {
			t.Fatal(err)
		}
		var mine []int
		for _, b := range collect(t, l, epoch) {
			checkRegressionBatch(t, b)
			mine = append(mine, b.Indices...)
		}
		if want := s.Indices(epoch); !slices.Equal(mine, want) {
			t.Fatalf("rank %d visited %v, its sampler gives %v", r, mine, want)
		}
		// the labelled loader over the same sampler visits the same examples
		ll, _ := NewLoader(indexSet(t, 50), 7, WithSampler(s))
		var labelled []int
		for _, b := range collect(t, ll, epoch) {
			labelled = append(labelled, b.Indices...)
		}
		if !slices.Equal(mine, labelled) {
			t.Fatalf("rank %d: tensor loader %v, labelled loader %v", r, mine, labelled)
		}
		all = append(all, mine...)
	}
	if len(all) != 51 { // 50 padded to 51 = 3×17
		t.Fatalf("%d indices over %d ranks, want 51", len(all), world)
	}
	slices.Sort(all)
	if got := slices.Compact(all); !slices.Equal(got, seq(50)) {
		t.Fatalf("the ranks do not cover the data set: %v", got)
	}
}

// gatedTensors blocks every Read until the gate opens, counting calls.
type gatedTensors struct {
	*TensorDataset
	calls atomic.Int64
	gate  chan struct{}
}

func (g *gatedTensors) Read(i int, dst []any) error {
	g.calls.Add(1)
	<-g.gate
	return g.TensorDataset.Read(i, dst)
}

func TestTensorLoaderPrefetchIsBounded(t *testing.T) {
	testkit.CheckLeaks(t)
	g := &gatedTensors{TensorDataset: regressionSet(t, 100), gate: make(chan struct{})}
	close(g.gate)
	l, _ := NewTensorLoader(g, 1, Prefetch(3))
	it := l.Iterate(context.Background(), 0)
	defer it.Close()
	checkPrefetchBounded(t, &g.calls, func() {
		if !it.Next() || it.Batch().Indices[0] != 0 {
			t.Fatal("first batch missing")
		}
		checkRegressionBatch(t, it.Batch())
	})
}

// A Read blocked in the data set does not keep a cancelled epoch waiting.
func TestTensorLoaderCancel(t *testing.T) {
	testkit.CheckLeaks(t)
	g := &gatedTensors{TensorDataset: regressionSet(t, 100), gate: make(chan struct{})}
	l, _ := NewTensorLoader(g, 10, Workers(2))
	ctx, cancel := context.WithCancel(context.Background())
	it := l.Iterate(ctx, 0)
	waitFor(t, "workers started", func() bool { return g.calls.Load() >= 2 })
	cancel()
	if it.Next() || !errors.Is(it.Err(), context.Canceled) {
		t.Fatalf("after cancel: Next true or Err %v", it.Err())
	}
	close(g.gate)
	it.Close()
}

// wrongRow writes nothing and fails, as a data set with a bad example would.
type wrongRow struct{ *TensorDataset }

func (w wrongRow) Read(i int, dst []any) error {
	if i == 5 {
		return w.TensorDataset.Read(i, dst[:1]) // the wrong number of fields
	}
	return w.TensorDataset.Read(i, dst)
}

func TestTensorDatasetErrors(t *testing.T) {
	vec := func(n int) *tensor.Dense {
		return tensor.New(tensor.WithShape(n), tensor.WithBacking(make([]float32, n)))
	}
	mat := tensor.New(tensor.WithShape(4, 3), tensor.WithBacking(make([]float64, 12)))
	view, err := mat.Slice(nil, tensor.S(0, 2))
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]func() error{
		"no tensors":        func() error { _, err := NewTensorDataset(nil); return err },
		"different lengths": func() error { _, err := NewTensorDataset(nil, vec(3), vec(4)); return err },
		"repeated names":    func() error { _, err := NewTensorDataset([]string{"a", "a"}, vec(3), vec(3)); return err },
		"too few names":     func() error { _, err := NewTensorDataset([]string{"a"}, vec(3), vec(3)); return err },
		"nil tensor":        func() error { _, err := NewTensorDataset(nil, vec(3), nil); return err },
		"a view":            func() error { _, err := NewTensorDataset(nil, view.(*tensor.Dense)); return err },
		"Dtype option": func() error {
			_, err := NewTensorLoader(regressionSet(t, 3), 2, Dtype(tensor.Float64))
			return err
		},
		"nil set": func() error { _, err := NewTensorLoader(nil, 2); return err },
		"read out of range": func() error {
			return regressionSet(t, 3).Read(3, nil)
		},
		"wrong destination type": func() error {
			return regressionSet(t, 3).Read(0, []any{make([]float32, 3), make([]float32, 4), make([]float32, 1), make([]int64, 1)})
		},
	}
	for name, f := range bad {
		if err := f(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	l, _ := NewTensorLoader(wrongRow{regressionSet(t, 10)}, 4)
	var last error
	for _, err := range l.Epoch(context.Background(), 0) {
		last = err
	}
	if !errors.Is(last, ErrInvalidArgument) {
		t.Fatalf("a failing Read ended the epoch with %v", last)
	}
}
