package ddp_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
)

// TestGraphParityBackends runs the plain graph over TCP goroutine ranks
// too, with PyTorch's allreduce_hook as comm hook on three ranks.
func TestGraphParityBackends(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			pgs := be.make(t, 3)
			c := parityCase{name: "plain graph, allreduce_hook, " + be.name, build: plainNet,
				opts: []ddp.Option{ddp.WithCommHook[*comm.ProcessGroup](nil, ddp.AllReduceHook)}}
			runParityOn(t, pgs, c)
		})
	}
}

// TestGraphFloat32 trains a float32 graph on two ranks: the replicas agree
// bit for bit and follow one process on the whole batch to float32's
// precision.
func TestGraphFloat32(t *testing.T) {
	build := func(batch int) (*G.ExprGraph, *G.Node, G.Nodes, *G.Node, *G.Node) {
		rng := rand.New(rand.NewPCG(3, 3))
		g := G.NewGraph()
		w := make([]float32, 12)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * 0.5)
		}
		x := G.NewMatrix(g, G.Float32, G.WithShape(batch, 4), G.WithName("x"))
		y := G.NewMatrix(g, G.Float32, G.WithShape(batch, 3), G.WithName("y"))
		wn := G.NewMatrix(g, G.Float32, G.WithShape(4, 3), G.WithName("w"), G.WithValue(tensor.New(tensor.WithShape(4, 3), tensor.WithBacking(w))))
		loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(G.Must(G.Tanh(G.Must(G.Mul(x, wn)))), y))))))
		return g, loss, G.Nodes{wn}, x, y
	}
	const world, b, steps = 2, 4, 4
	rng := rand.New(rand.NewPCG(5, 5))
	xs := make([][]float32, steps)
	ys := make([][]float32, steps)
	for s := range steps {
		xs[s], ys[s] = make([]float32, world*b*4), make([]float32, world*b*3)
		for i := range xs[s] {
			xs[s][i] = float32(rng.NormFloat64())
		}
		for i := range ys[s] {
			ys[s][i] = float32(rng.NormFloat64())
		}
	}
	g, loss, params, x, y := build(world * b)
	if _, err := G.Grad(loss, params...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(params...))
	solver := G.NewVanillaSolver(G.WithLearnRate(0.1))
	for s := range steps {
		G.Let(x, tensor.New(tensor.WithShape(world*b, 4), tensor.WithBacking(xs[s])))
		G.Let(y, tensor.New(tensor.WithShape(world*b, 3), tensor.WithBacking(ys[s])))
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		vm.Reset()
		if err := solver.Step(G.NodesToValueGrads(params)); err != nil {
			t.Fatal(err)
		}
	}
	ref := params[0].Value().(*tensor.Dense).Float32s()

	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	got := make([][]float32, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		g, loss, params, x, y := build(b)
		n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: g, Loss: loss, Params: params})
		if err != nil {
			return err
		}
		solver := G.NewVanillaSolver(G.WithLearnRate(0.1))
		for s := range steps {
			f := ddp.ByNode{
				x: tensor.New(tensor.WithShape(b, 4), tensor.WithBacking(xs[s][r*b*4:(r+1)*b*4])),
				y: tensor.New(tensor.WithShape(b, 3), tensor.WithBacking(ys[s][r*b*3:(r+1)*b*3])),
			}
			if _, err := n.Step(ctx, f); err != nil {
				return err
			}
			if err := n.Apply(solver); err != nil {
				return err
			}
		}
		got[r] = params[0].Value().(*tensor.Dense).Float32s()
		return nil
	})
	for i := range ref {
		if got[0][i] != got[1][i] {
			t.Fatalf("weight %d differs across ranks: %v vs %v", i, got[0][i], got[1][i])
		}
		if d := math.Abs(float64(got[0][i] - ref[i])); d > 1e-6 {
			t.Errorf("weight %d: %v, one process %v", i, got[0][i], ref[i])
		}
	}
}

// TestGraphBuffers: a buffer node takes rank 0's value in NewGraph and
// before every step.
func TestGraphBuffers(t *testing.T) {
	pgs := localWorld(t, 2)
	ctx := testCtx(t, 30*time.Second)
	testkit.RequireEachRank(t, 2, func(r int) error {
		net := plainNet(4, 1)
		scale := G.NewMatrix(net.g, G.Float64, G.WithShape(1, 1), G.WithName("scale"),
			G.WithValue(tensor.New(tensor.WithShape(1, 1), tensor.WithBacking([]float64{float64(10 + r)}))))
		net.loss = G.Must(G.Mul(net.loss, G.Must(G.Sum(scale))))
		n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params, Buffers: G.Nodes{scale}})
		if err != nil {
			return err
		}
		if v := scale.Value().Data().([]float64)[0]; v != 10 {
			return fmt.Errorf("after NewGraph the buffer holds %v, want rank 0's 10", v)
		}
		scale.Value().Data().([]float64)[0] = float64(20 + r)
		if _, err := n.Step(ctx, ddp.ByName(dataFor(net, 1, 4, 1)[0])); err != nil {
			return err
		}
		if v := scale.Value().Data().([]float64)[0]; v != 20 {
			return fmt.Errorf("after a step the buffer holds %v, want rank 0's 20", v)
		}
		return nil
	})
}

// TestGraphJoin: rank 0 has three batches, rank 1 two. Inside Join, rank 1
// shadows rank 0's third step with zero gradients, and both end with rank
// 0's weights: those of one process that trains on both shards twice and
// then on rank 0's third shard alone, at half the rate (the average is
// still over two ranks).
func TestGraphJoin(t *testing.T) {
	const world, b, eta = 2, 4, 0.1
	data := dataFor(plainNet(b*world, 1), 3, b*world, 11)

	full, half := plainNet(b*world, 1), plainNet(b, 1)
	for i, p := range half.params {
		if err := G.Let(p, full.params[i].Value()); err != nil {
			t.Fatal(err)
		}
	}
	var vms []G.VM
	for _, n := range []*gnet{full, half} {
		if _, err := G.Grad(n.loss, n.params...); err != nil {
			t.Fatal(err)
		}
		vms = append(vms, G.NewTapeMachine(n.g, G.BindDualValues(n.params...)))
	}
	run := func(k int, n *gnet, f ddp.ByName, lr float64) {
		for name, v := range f {
			G.Let(n.inputs[name], v)
		}
		if err := vms[k].RunAll(); err != nil {
			t.Fatal(err)
		}
		vms[k].Reset()
		if err := G.NewVanillaSolver(G.WithLearnRate(lr)).Step(G.NodesToValueGrads(n.params)); err != nil {
			t.Fatal(err)
		}
	}
	run(0, full, shard(data[0], 0, b*world), eta)
	run(0, full, shard(data[1], 0, b*world), eta)
	run(1, half, shard(data[2], 0, b), eta/2)
	refW := valuesOf(full.params)

	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	weights := make([][][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		net := plainNet(b, 1+uint64(r))
		n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params})
		if err != nil {
			return err
		}
		solver := G.NewVanillaSolver(G.WithLearnRate(eta))
		err = n.Join(ctx, func() error {
			for s := range 3 - r {
				if _, err := n.Step(ctx, shard(data[s], r, b)); err != nil {
					return err
				}
				if err := n.Apply(solver); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		weights[r] = valuesOf(net.params)
		if st := n.Stats(); st.Steps != int64(3-r) || st.ShadowSteps != int64(r) {
			return fmt.Errorf("stats: %d steps, %d shadowed; want %d and %d", st.Steps, st.ShadowSteps, 3-r, r)
		}
		return nil
	})
	for r := range world {
		if d := maxAbs(weights[r], refW); d > 1e-12 {
			t.Errorf("rank %d: weights differ by %.3g from one process", r, d)
		} else {
			t.Logf("join, rank %d: max |weight - reference| %.3g", r, d)
		}
	}
}
