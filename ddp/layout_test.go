package ddp_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/models"
)

// swapped is a model whose Params list one layer first while Forward uses
// it last, so its gradients become ready in an order the initial bucket
// layout (reverse Params order) does not expect.
type swapped struct{ first, second *models.Linear }

func newSwapped(t *testing.T, in, hidden, out int, seed uint64) *swapped {
	rng := rand.New(rand.NewPCG(seed, 1))
	a, err := models.NewLinear(hidden, out, models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	b, err := models.NewLinear(in, hidden, models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	a.Weight.Name, a.Bias.Name = "out.weight", "out.bias"
	b.Weight.Name, b.Bias.Name = "in.weight", "in.bias"
	return &swapped{first: a, second: b}
}

func (s *swapped) Params() []*models.Param {
	return append(s.first.Params(), s.second.Params()...)
}
func (s *swapped) Buffers() []*models.Param { return nil }
func (s *swapped) Forward(b *models.Builder, x *G.Node) (*G.Node, error) {
	h, err := s.second.Forward(b, x)
	if err != nil {
		return nil, err
	}
	return s.first.Forward(b, h)
}

// TestBucketsRebuiltInReadyOrder checks the initial layout (parameters in
// reverse order, packed by size) and its rebuild after the first step in the
// order gradients actually became ready, identical on every rank.
func TestBucketsRebuiltInReadyOrder(t *testing.T) {
	const world = 2
	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	layouts := make([][][]string, world)
	before := make([][][]string, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		m := newSwapped(t, 6, 8, 3, 5)
		// Each weight is 192 or 384 bytes; a cap of 200 bytes puts every
		// weight in a bucket of its own.
		net, err := ddp.New(ctx, pgs[r], m, ddp.BucketCapMB(200.0/(1<<20)), ddp.Workers(1))
		if err != nil {
			return err
		}
		before[r] = names(net.Buckets())
		x, y := batch(uint64(r), 4, 6, 3)
		for s := 0; s < 2; s++ {
			if _, err := net.Step(ctx, x, y); err != nil {
				return err
			}
			if s == 0 && net.Stats().Rebuilt {
				return fmt.Errorf("rebuilt during the first step")
			}
		}
		if !net.Stats().Rebuilt {
			return fmt.Errorf("not rebuilt after two steps")
		}
		layouts[r] = names(net.Buckets())
		return nil
	})
	wantBefore := [][]string{{"in.bias", "in.weight"}, {"out.bias", "out.weight"}}
	t.Logf("layout before %v, after the first step %v", before[0], layouts[0])
	if !reflect.DeepEqual(before[0], wantBefore) {
		t.Errorf("initial layout %v, want %v (reverse order of Params)", before[0], wantBefore)
	}
	// The output layer's gradients are ready first: its bias, then its
	// weight; then the input layer's.
	first := layouts[0][0]
	if len(first) == 0 || !strings.HasPrefix(first[0], "out.") {
		t.Errorf("rebuilt layout %v: the first bucket should hold the output layer's gradients, which are ready first", layouts[0])
	}
	for r := 1; r < world; r++ {
		if !reflect.DeepEqual(layouts[r], layouts[0]) {
			t.Errorf("rank %d's layout %v differs from rank 0's %v", r, layouts[r], layouts[0])
		}
	}
}

func names(bs []ddp.BucketInfo) [][]string {
	out := make([][]string, len(bs))
	for i, b := range bs {
		out[i] = b.Params
	}
	return out
}

// TestDefaultLayoutOfBenchMLP checks the layout c10d gives the benchmark's
// model: 2.weight crosses the 1 MiB first cap, the first layer stays in a
// second bucket.
func TestDefaultLayoutOfBenchMLP(t *testing.T) {
	pgs := localWorld(t, 1)
	ctx := testCtx(t, 30*time.Second)
	m := newMLP(t, []int{784, 1024, 1024, 10}, 1)
	net, err := ddp.New(ctx, pgs[0], m)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"4.bias", "4.weight", "2.bias", "2.weight"}, {"0.bias", "0.weight"}}
	if got := names(net.Buckets()); !reflect.DeepEqual(got, want) {
		t.Errorf("layout %v, want %v", got, want)
	}
}

// TestMismatchedModelsFailOnEveryRank gives rank 1 a model of another shape:
// every rank's New fails with ErrMismatch naming the entry and both ranks.
func TestMismatchedModelsFailOnEveryRank(t *testing.T) {
	cases := []struct {
		name  string
		sizes func(r int) []int
		opts  func(r int) []ddp.Option
		want  string
	}{
		{"shape", func(r int) []int {
			if r == 1 {
				return []int{5, 7, 3}
			}
			return []int{5, 6, 3}
		}, nil, "entry 0 of the state is parameter 0.weight float64 [6 5] on rank 0 but parameter 0.weight float64 [7 5] on rank 1"},
		{"count", func(r int) []int {
			if r == 2 {
				return []int{5, 6, 6, 3}
			}
			return []int{5, 6, 3}
		}, nil, "on rank 2"},
		{"options", func(int) []int { return []int{5, 6, 3} }, func(r int) []ddp.Option {
			if r == 1 {
				return []ddp.Option{ddp.BucketCapMB(1)}
			}
			return nil
		}, "options differ across ranks"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const world = 3
			pgs := localWorld(t, world)
			ctx := testCtx(t, 30*time.Second)
			errs := testkit.EachRank(world, func(r int) error {
				var opts []ddp.Option
				if c.opts != nil {
					opts = c.opts(r)
				}
				_, err := ddp.New(ctx, pgs[r], newMLP(t, c.sizes(r), uint64(r)), opts...)
				return err
			})
			for r, err := range errs {
				if !errors.Is(err, ddp.ErrMismatch) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("rank %d: got %v; want ErrMismatch mentioning %q", r, err, c.want)
				}
			}
		})
	}
}

// TestBroadcastOverwritesOtherRanks checks that New gives every rank rank 0's
// parameters.
func TestBroadcastOverwritesOtherRanks(t *testing.T) {
	const world = 3
	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	ms := make([]*models.Sequential, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		ms[r] = newMLP(t, []int{4, 5, 2}, uint64(10+r))
		_, err := ddp.New(ctx, pgs[r], ms[r])
		return err
	})
	for r := 1; r < world; r++ {
		for i, p := range ms[r].Params() {
			if !reflect.DeepEqual(p.Value.Float64s(), ms[0].Params()[i].Value.Float64s()) {
				t.Errorf("rank %d's %s differs from rank 0's", r, p.Name)
			}
		}
	}
}
