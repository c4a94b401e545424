package ddp_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/models"
)

// bnNet is conv → batch norm → ReLU → linear, so the batch norm's input
// gradient reaches a parameter upstream.
func bnNet(t *testing.T) *models.Sequential {
	rng := rand.New(rand.NewPCG(3, 3))
	conv, err := models.NewConv2d(2, 4, 3, models.WithPadding(1, 1), models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	bn, err := models.NewBatchNorm2d(4, models.WithMomentum(0.3), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	lin, err := models.NewLinear(4*5*5, 3, models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	return models.NewSequential(conv, bn, models.ReLU{}, models.Flatten{}, lin)
}

func imageBatch(seed uint64, n int) (*tensor.Dense, *tensor.Dense) {
	rng := rand.New(rand.NewPCG(seed, 11))
	x := make([]float64, n*2*5*5)
	for i := range x {
		x[i] = 3 + 2*rng.NormFloat64()
	}
	y := make([]int64, n)
	for i := range y {
		y[i] = int64(rng.IntN(3))
	}
	return tensor.New(tensor.WithShape(n, 2, 5, 5), tensor.WithBacking(x)), tensor.New(tensor.WithShape(n), tensor.WithBacking(y))
}

// TestSyncBatchNormEqualsOneBigBatch trains with SyncBatchNorm on three
// ranks and with plain BatchNorm2d on one rank holding all their examples:
// the mean of the ranks' losses equals the big batch's loss, and the
// parameters and running statistics after two steps are the same.
func TestSyncBatchNormEqualsOneBigBatch(t *testing.T) {
	const world, rowsPer, steps, lr = 3, 4, 2, 0.1
	pgs := localWorld(t, world)
	one := localWorld(t, 1)
	ctx := testCtx(t, 60*time.Second)
	data := func(r, s int) (*tensor.Dense, *tensor.Dense) { return imageBatch(uint64(10*s+r), rowsPer) }
	losses := make([][]float64, world)
	states := make([][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		m := bnNet(t)
		conv, n, err := ddp.ConvertSyncBatchNorm(ctx, pgs[r], m)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("converted %d layers, want 1", n)
		}
		if _, ok := m.Layers[1].(*ddp.SyncBatchNorm); !ok || conv != models.Module(m) {
			return fmt.Errorf("layer 1 is %T", m.Layers[1])
		}
		net, err := ddp.New(ctx, pgs[r], m)
		if err != nil {
			return err
		}
		for s := 0; s < steps; s++ {
			x, y := data(r, s)
			loss, err := net.Step(ctx, x, y)
			if err != nil {
				return err
			}
			losses[r] = append(losses[r], loss)
			sgd(net.Parameters(), lr)
		}
		for _, p := range models.StateDict(m) {
			states[r] = append(states[r], asFloats(p.Value)...)
		}
		return nil
	})

	ref := bnNet(t)
	net, err := ddp.New(ctx, one[0], ref)
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s < steps; s++ {
		var xs, ys []*tensor.Dense
		for r := range world {
			x, y := data(r, s)
			xs, ys = append(xs, x), append(ys, y)
		}
		x, y := concat(xs), concat(ys)
		loss, err := net.Step(ctx, x, y)
		if err != nil {
			t.Fatal(err)
		}
		mean := 0.0
		for r := range world {
			mean += losses[r][s] / world
		}
		if !relClose(mean, loss, 1e-12) {
			t.Errorf("step %d: mean of the ranks' losses %v, big batch %v", s, mean, loss)
		}
		sgd(net.Parameters(), lr)
	}
	var want []float64
	var names []string
	for _, p := range models.StateDict(ref) {
		for range p.Value.Shape().TotalSize() {
			names = append(names, p.Name)
		}
		want = append(want, asFloats(p.Value)...)
	}
	for r := range world {
		for i := range want {
			if !relClose(states[r][i], want[i], 1e-10) {
				t.Fatalf("rank %d: %s (element %d) is %v, big batch %v", r, names[i], i, states[r][i], want[i])
			}
		}
	}
}

// TestSyncBatchNormEvalUsesRunningStats: in evaluation mode the layer
// normalizes with the running statistics and communicates nothing.
func TestSyncBatchNormEvalUsesRunningStats(t *testing.T) {
	pgs := localWorld(t, 1)
	ctx := testCtx(t, 30*time.Second)
	bn, err := models.NewBatchNorm2d(2, models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	copy(bn.RunningMean.Value.Float64s(), []float64{1, -2})
	copy(bn.RunningVar.Value.Float64s(), []float64{4, 0.25})
	copy(bn.Weight.Value.Float64s(), []float64{2, 3})
	copy(bn.Bias.Value.Float64s(), []float64{0.5, -0.5})
	sbn, err := ddp.NewSyncBatchNorm(bn, pgs[0])
	if err != nil {
		t.Fatal(err)
	}
	b := models.NewBuilder(nil, models.WithMode(models.Eval))
	x, _ := imageBatch(1, 2)
	out, err := sbn.Forward(b, b.Bind("x", x))
	if err != nil {
		t.Fatal(err)
	}
	prog, err := graph.Compile(b.Graph())
	if err != nil {
		t.Fatal(err)
	}
	if err := prog.Run(ctx); err != nil {
		t.Fatal(err)
	}
	got := out.Value().(*tensor.Dense).Float64s()
	xs := x.Float64s()
	mean, vr, w, bias := []float64{1, -2}, []float64{4, 0.25}, []float64{2, 3}, []float64{0.5, -0.5}
	for i, v := range xs {
		ch := (i / 25) % 2
		want := (v-mean[ch])/math.Sqrt(vr[ch]+1e-5)*w[ch] + bias[ch]
		if !relClose(got[i], want, 1e-14) {
			t.Fatalf("element %d: %v, want %v", i, got[i], want)
		}
	}
}

func sgd(ps []*models.Param, lr float64) {
	for _, p := range ps {
		if p.Grad == nil {
			continue
		}
		for i, g := range p.Grad.Float64s() {
			p.Value.Float64s()[i] -= lr * g
		}
	}
}

func asFloats(t *tensor.Dense) []float64 {
	switch t.Dtype() {
	case tensor.Float64:
		return append([]float64(nil), t.Float64s()...)
	case tensor.Int64:
		var out []float64
		for _, v := range t.Int64s() {
			out = append(out, float64(v))
		}
		return out
	}
	panic(fmt.Sprintf("dtype %v", t.Dtype()))
}

// concat stacks tensors along their first axis.
func concat(ts []*tensor.Dense) *tensor.Dense {
	shape := ts[0].Shape().Clone()
	n := 0
	for _, t := range ts {
		n += t.Shape()[0]
	}
	shape[0] = n
	if ts[0].Dtype() == tensor.Int64 {
		var all []int64
		for _, t := range ts {
			all = append(all, t.Int64s()...)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(all))
	}
	var all []float64
	for _, t := range ts {
		all = append(all, t.Float64s()...)
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(all))
}
