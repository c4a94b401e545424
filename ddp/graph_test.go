package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// gnet is a plain gorgonia model: a graph, its loss, its learnable nodes
// and its input nodes by name.
type gnet struct {
	g      *G.ExprGraph
	loss   *G.Node
	params G.Nodes
	inputs map[string]*G.Node
	extra  map[string]*G.Node // other outputs
	grads  G.Nodes            // the gradient nodes built with the graph (nil: NewGraph and the reference build them)
}

// randDense returns a float64 tensor of the given shape with values drawn
// from rng.
func randDense(rng *rand.Rand, scale float64, shape ...int) *tensor.Dense {
	n := 1
	for _, s := range shape {
		n *= s
	}
	v := make([]float64, n)
	for i := range v {
		v[i] = scale * rng.NormFloat64()
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}

// plainNet is pred = sigmoid(x·W1)·W2, loss = mean((pred-y)²), the weights
// drawn from seed.
func plainNet(batch int, seed uint64) *gnet {
	rng := rand.New(rand.NewPCG(seed, 1))
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(batch, 4), G.WithName("x"))
	y := G.NewMatrix(g, G.Float64, G.WithShape(batch, 2), G.WithName("y"))
	w1 := G.NewMatrix(g, G.Float64, G.WithShape(4, 5), G.WithName("w1"), G.WithValue(randDense(rng, 0.5, 4, 5)))
	w2 := G.NewMatrix(g, G.Float64, G.WithShape(5, 2), G.WithName("w2"), G.WithValue(randDense(rng, 0.5, 5, 2)))
	h := G.Must(G.Sigmoid(G.Must(G.Mul(x, w1))))
	pred := G.Must(G.Mul(h, w2))
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(pred, y))))))
	return &gnet{g: g, loss: loss, params: G.Nodes{w1, w2}, inputs: map[string]*G.Node{"x": x, "y": y}}
}

// multiNet has two inputs and two heads with a loss each, summed:
// h = tanh(a·A + b·B), l1 = mean((h·C - y1)²), l2 = mean((h·D - y2)²).
func multiNet(batch int, seed uint64) *gnet {
	rng := rand.New(rand.NewPCG(seed, 2))
	g := G.NewGraph()
	a := G.NewMatrix(g, G.Float64, G.WithShape(batch, 3), G.WithName("a"))
	b := G.NewMatrix(g, G.Float64, G.WithShape(batch, 2), G.WithName("b"))
	y1 := G.NewMatrix(g, G.Float64, G.WithShape(batch, 1), G.WithName("y1"))
	y2 := G.NewMatrix(g, G.Float64, G.WithShape(batch, 2), G.WithName("y2"))
	wa := G.NewMatrix(g, G.Float64, G.WithShape(3, 6), G.WithName("wa"), G.WithValue(randDense(rng, 0.5, 3, 6)))
	wb := G.NewMatrix(g, G.Float64, G.WithShape(2, 6), G.WithName("wb"), G.WithValue(randDense(rng, 0.5, 2, 6)))
	wc := G.NewMatrix(g, G.Float64, G.WithShape(6, 1), G.WithName("wc"), G.WithValue(randDense(rng, 0.5, 6, 1)))
	wd := G.NewMatrix(g, G.Float64, G.WithShape(6, 2), G.WithName("wd"), G.WithValue(randDense(rng, 0.5, 6, 2)))
	h := G.Must(G.Tanh(G.Must(G.Add(G.Must(G.Mul(a, wa)), G.Must(G.Mul(b, wb))))))
	l1 := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(G.Must(G.Mul(h, wc)), y1))))))
	l2 := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(G.Must(G.Mul(h, wd)), y2))))))
	loss := G.Must(G.Add(l1, l2))
	return &gnet{g: g, loss: loss, params: G.Nodes{wa, wb, wc, wd},
		inputs: map[string]*G.Node{"a": a, "b": b, "y1": y1, "y2": y2},
		extra:  map[string]*G.Node{"l1": l1, "l2": l2}}
}

// dataFor returns full-batch data for a net's inputs: steps batches of
// rows rows each.
func dataFor(net *gnet, steps, rows int, seed uint64) []map[string]*tensor.Dense {
	rng := rand.New(rand.NewPCG(seed, 3))
	out := make([]map[string]*tensor.Dense, steps)
	names := make([]string, 0, len(net.inputs))
	for k := range net.inputs {
		names = append(names, k)
	}
	sortStrings(names)
	for s := range out {
		out[s] = map[string]*tensor.Dense{}
		for _, k := range names {
			cols := net.inputs[k].Shape()[1]
			out[s][k] = randDense(rng, 1, rows, cols)
		}
	}
	return out
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// shard returns rows [r*b, (r+1)*b) of every tensor.
func shard(m map[string]*tensor.Dense, r, b int) ddp.ByName {
	out := ddp.ByName{}
	for k, t := range m {
		out[k] = rows2(t, r*b, (r+1)*b)
	}
	return out
}

func rows2(t *tensor.Dense, a, b int) *tensor.Dense {
	w := t.Shape()[1]
	return tensor.New(tensor.WithShape(b-a, w), tensor.WithBacking(append([]float64(nil), t.Float64s()[a*w:b*w]...)))
}

func valuesOf(nodes G.Nodes) [][]float64 {
	out := make([][]float64, len(nodes))
	for i, n := range nodes {
		out[i] = append([]float64(nil), n.Value().(*tensor.Dense).Float64s()...)
	}
	return out
}

// reference trains net on the full batches in one process, as a plain
// gorgonia program would: TapeMachine with BindDualValues, G.Grad, and a
// vanilla solver of rate eta, or Tandem's Adam when adam is set. It returns
// every step's loss and the final weights.
func reference(t *testing.T, net *gnet, data []map[string]*tensor.Dense, eta float64, adam bool) ([]float64, [][]float64) {
	return referenceClip(t, net, data, eta, adam, 0)
}

// clipGrads scales the gradients (node.Grad()) of nodes so that their
// global norm is at most maxNorm, as torch.nn.utils.clip_grad_norm_ does,
// and returns the norm before clipping.
func clipGrads(nodes G.Nodes, maxNorm float64) (float64, error) {
	var gs []*tensor.Dense
	sum := 0.0
	for _, n := range nodes {
		g, err := n.Grad()
		if err != nil {
			return 0, err
		}
		gs = append(gs, g.(*tensor.Dense))
		for _, v := range g.(*tensor.Dense).Float64s() {
			sum += v * v
		}
	}
	norm := math.Sqrt(sum)
	if norm <= maxNorm {
		return norm, nil
	}
	f := maxNorm / norm
	for _, g := range gs {
		for i := range g.Float64s() {
			g.Float64s()[i] *= f
		}
	}
	return norm, nil
}

// referenceClip is reference, with the gradients clipped to a global norm
// of clip before each update (0: no clipping).
func referenceClip(t *testing.T, net *gnet, data []map[string]*tensor.Dense, eta float64, adam bool, clip float64) ([]float64, [][]float64) {
	t.Helper()
	grads := net.grads
	var err error
	if grads == nil {
		if grads, err = G.Grad(net.loss, net.params...); err != nil {
			t.Fatal(err)
		}
	}
	vm := G.NewTapeMachine(net.g, G.BindDualValues(net.params...))
	defer vm.Close()
	solver := G.NewVanillaSolver(G.WithLearnRate(eta))
	var opt *optim.Adam
	var ps []*models.Param
	if adam {
		for _, p := range net.params {
			ps = append(ps, &models.Param{Name: p.Name(), Value: p.Value().(*tensor.Dense), RequiresGrad: true})
		}
		if opt, err = optim.NewAdam(ps, optim.LR(eta)); err != nil {
			t.Fatal(err)
		}
	}
	var losses []float64
	for _, d := range data {
		for k, v := range d {
			if err := G.Let(net.inputs[k], v); err != nil {
				t.Fatal(err)
			}
		}
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, net.loss.Value().Data().(float64))
		if clip > 0 {
			if _, err := clipGrads(net.params, clip); err != nil {
				t.Fatal(err)
			}
		}
		if adam {
			for i, gn := range grads {
				ps[i].Grad = gn.Value().(*tensor.Dense)
			}
			if err := opt.Step(); err != nil {
				t.Fatal(err)
			}
			for _, p := range net.params { // the dual values accumulate; a solver would have zeroed them
				g, _ := p.Grad()
				g.(*tensor.Dense).Zero()
			}
		} else if err := solver.Step(G.NodesToValueGrads(net.params)); err != nil {
			t.Fatal(err)
		}
		vm.Reset()
	}
	return losses, valuesOf(net.params)
}

// maxAbs returns the largest absolute difference between a and b.
func maxAbs(a, b [][]float64) float64 {
	m := 0.0
	for i := range a {
		for j := range a[i] {
			m = math.Max(m, math.Abs(a[i][j]-b[i][j]))
		}
	}
	return m
}

type parityCase struct {
	name  string
	build func(batch int, seed uint64) *gnet
	opts  []ddp.Option
	adam  bool
	// direct: the solver's Step on net.ValueGrads(), without Apply
	direct bool
	// clip: the reference clips its gradients to this global norm (the
	// drive function does the same to the DDP's)
	clip  float64
	drive func(ctx context.Context, n *ddp.GraphDDP, net *gnet, f ddp.ByName) (float64, error) // nil: Step
	// oneWorker: the graph executor on one worker (opts holds ddp.Workers(1))
	oneWorker bool
}

// runParity trains with DDP on world goroutine ranks, each with its shard
// of every batch and its own initial weights (rank 0's are the
// reference's), and compares every step's loss (averaged over the ranks)
// and the final weights of every rank with one process on the full batch.
func runParity(t *testing.T, world int, c parityCase) (lossDiff, weightDiff float64, stats ddp.Stats) {
	t.Helper()
	return runParityOn(t, localWorld(t, world), c)
}

// runParityOn is runParity over the given groups.
func runParityOn(t *testing.T, pgs []*comm.ProcessGroup, c parityCase) (lossDiff, weightDiff float64, stats ddp.Stats) {
	t.Helper()
	world := len(pgs)
	const b, steps, eta = 4, 5, 0.1
	data := dataFor(c.build(b*world, 1), steps, b*world, 42)
	refLoss, refW := referenceClip(t, c.build(b*world, 1), data, eta, c.adam, c.clip)

	ctx := testCtx(t, 60*time.Second)
	losses := make([][]float64, world)
	weights := make([][][]float64, world)
	allStats := make([]ddp.Stats, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		net := c.build(b, 1+uint64(r)*1000) // every rank but 0 starts elsewhere: NewGraph broadcasts
		opts := append([]ddp.Option{ddp.BucketCapMB(1e-5), ddp.FirstBucketCapMB(1e-5)}, c.opts...)
		n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params, Grads: net.grads}, opts...)
		if err != nil {
			return err
		}
		solver := G.NewVanillaSolver(G.WithLearnRate(eta))
		var opt *optim.Adam
		if c.adam {
			if opt, err = optim.NewAdam(n.Params(), optim.LR(eta)); err != nil {
				return err
			}
		}
		for s := range steps {
			f := shard(data[s], r, b)
			var loss float64
			if c.drive != nil {
				loss, err = c.drive(ctx, n, net, f)
			} else {
				loss, err = n.Step(ctx, f)
			}
			if err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			losses[r] = append(losses[r], loss)
			switch {
			case c.adam:
				err = opt.Step()
			case c.direct:
				err = solver.Step(n.ValueGrads())
			default:
				err = n.Apply(solver)
			}
			if err != nil {
				return err
			}
		}
		weights[r] = valuesOf(net.params)
		allStats[r] = n.Stats()
		return nil
	})
	for s := range steps {
		mean := 0.0
		for r := range world {
			mean += losses[r][s]
		}
		mean /= float64(world)
		lossDiff = math.Max(lossDiff, math.Abs(mean-refLoss[s]))
	}
	for r := range world {
		weightDiff = math.Max(weightDiff, maxAbs(weights[r], refW))
	}
	if lossDiff > 1e-12 || weightDiff > 1e-12 {
		t.Errorf("%s over %d ranks: loss differs by %.3g, weights by %.3g from one process on the whole batch; want at most 1e-12", c.name, world, lossDiff, weightDiff)
	}
	t.Logf("%s, %d ranks: max |loss - reference| %.3g, max |weight - reference| %.3g", c.name, world, lossDiff, weightDiff)
	return lossDiff, weightDiff, allStats[0]
}

// TestGraphParity: DDP over a plain gorgonia graph and over a two-input,
// two-loss graph, on 2 and 3 ranks, under the graph executor (with
// overlap) and under TapeMachine, with a gorgonia solver and with Tandem's
// Adam, equals one process on the concatenated batch to 1e-12.
func TestGraphParity(t *testing.T) {
	cases := []parityCase{
		{name: "plain graph, graph executor, vanilla solver", build: plainNet},
		{name: "multi-input graph, graph executor, vanilla solver", build: multiNet},
		{name: "plain graph, TapeMachine, vanilla solver", build: plainNet, opts: []ddp.Option{ddp.WithTapeMachine()}},
		{name: "multi-input graph, TapeMachine, Tandem Adam", build: multiNet, opts: []ddp.Option{ddp.WithTapeMachine()}, adam: true},
		{name: "multi-input graph, graph executor, Tandem Adam", build: multiNet, adam: true},
	}
	// Under the graph executor the gradients' ready order on the first
	// step decides the rebuilt buckets, and with several workers that order
	// can change from one step to the next (a late w2 on the first step puts
	// w1's bucket first, which is then ready last in every later step). So
	// each graph-executor case runs again on one worker (ddp.Workers(1)),
	// whose order is fixed, and that run must overlap.
	for _, c := range cases {
		if len(c.opts) > 0 {
			continue
		}
		seq := c
		seq.name = c.name + " on one worker"
		seq.opts = []ddp.Option{ddp.Workers(1)}
		seq.oneWorker = true
		cases = append(cases, seq)
	}
	for _, c := range cases {
		for _, world := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/%d", c.name, world), func(t *testing.T) {
				_, _, st := runParity(t, world, c)
				tape := len(c.opts) > 0 && !c.oneWorker
				if st.Steps != 5 || st.BucketsReduced == 0 {
					t.Errorf("stats %+v: want 5 steps and reduced buckets", st)
				}
				if tape && st.BucketsOverlapped != 0 {
					t.Errorf("TapeMachine: %d buckets counted as overlapped; TapeMachine has no hooks", st.BucketsOverlapped)
				}
				// Under the graph executor every gradient of these graphs is
				// computed in its bucket view; TapeMachine's are copied in.
				if all := int64(5 * len(c.build(1, 1).params)); tape && (st.GradsInBucket != 0 || st.GradsCopied != all) || !tape && (st.GradsInBucket != all || st.GradsCopied != 0) {
					t.Errorf("gradients computed in the buckets %d, copied in %d; want %d of %d in the buckets (TapeMachine %v)", st.GradsInBucket, st.GradsCopied, map[bool]int64{true: 0, false: all}[tape], all, tape)
				}
				if c.oneWorker && st.BucketsOverlapped == 0 {
					t.Errorf("graph executor on one worker: no bucket started before the backward pass ended (stats %v)", st)
				}
				// The graph executor says when the loss is ready, TapeMachine
				// does not: its runs count in ComputeTime alone.
				if split := st.ForwardTime + st.BackwardTime; tape && split != 0 || !tape && (split != st.ComputeTime || st.ForwardTime <= 0 || st.BackwardTime <= 0) {
					t.Errorf("forward %v + backward %v against compute %v (TapeMachine %v)", st.ForwardTime, st.BackwardTime, st.ComputeTime, tape)
				}
			})
		}
	}
}

// TestGraphPassLoop drives the reducer by hand: Prepare, Run, read both
// losses, Finish, inspect and clip the averaged gradients, Apply; and
// gradient accumulation over two micro-batches with NoSync. Both match one
// process on the whole batch.
func TestGraphPassLoop(t *testing.T) {
	t.Run("two losses, clipped", func(t *testing.T) {
		runParity(t, 2, parityCase{name: "Prepare/Run/Finish with two losses, clipped", build: multiNet, clip: 0.05,
			drive: func(ctx context.Context, n *ddp.GraphDDP, net *gnet, f ddp.ByName) (float64, error) {
				p, err := n.Prepare(ctx)
				if err != nil {
					return 0, err
				}
				loss, err := p.Run(ctx, f)
				if err != nil {
					return 0, err
				}
				l1 := net.extra["l1"].Value().Data().(float64)
				l2 := net.extra["l2"].Value().Data().(float64)
				if math.Abs(l1+l2-loss) > 1e-15*math.Abs(loss) {
					return 0, fmt.Errorf("l1 %v + l2 %v != loss %v", l1, l2, loss)
				}
				if err := p.Finish(ctx); err != nil {
					return 0, err
				}
				// The averaged gradients, node.Grad() and Params()[i].Grad alike,
				// clipped to a global norm every step reaches here.
				for i, nd := range n.Nodes() {
					g, err := nd.Grad()
					if err != nil {
						return 0, err
					}
					if g.(*tensor.Dense) != n.Params()[i].Grad {
						return 0, fmt.Errorf("node.Grad() and Params()[%d].Grad differ", i)
					}
				}
				norm, err := clipGrads(n.Nodes(), 0.05)
				if err == nil && norm <= 0.05 {
					err = fmt.Errorf("gradient norm %v: the clipping did nothing", norm)
				}
				return loss, err
			}})
	})
	t.Run("the loop runs the DDP's program itself", func(t *testing.T) {
		runParity(t, 3, parityCase{name: "Prepare, Program().Run, Finish; solver.Step(ValueGrads())", build: multiNet, direct: true,
			drive: func(ctx context.Context, n *ddp.GraphDDP, net *gnet, f ddp.ByName) (float64, error) {
				p, err := n.Prepare(ctx)
				if err != nil {
					return 0, err
				}
				var binds []graph.Binding
				for k, v := range f {
					binds = append(binds, graph.Bind(net.inputs[k], v))
				}
				if err := n.Program().Run(ctx, binds...); err != nil {
					return 0, err
				}
				if err := p.Finish(ctx); err != nil {
					return 0, err
				}
				return net.loss.Value().Data().(float64), nil
			}})
	})
	t.Run("accumulation over two micro-batches", func(t *testing.T) {
		const world, b, steps, eta = 2, 4, 4, 0.1
		data := dataFor(plainNet(2*b*world, 1), steps, 2*b*world, 9)
		// Two micro-batches of mean losses accumulate twice the mean over the
		// whole batch: the reference steps at twice the rate.
		_, refW := reference(t, plainNet(2*b*world, 1), data, 2*eta, false)
		pgs := localWorld(t, world)
		ctx := testCtx(t, 60*time.Second)
		weights := make([][][]float64, world)
		testkit.RequireEachRank(t, world, func(r int) error {
			net := plainNet(b, 1+uint64(r))
			n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params})
			if err != nil {
				return err
			}
			solver := G.NewVanillaSolver(G.WithLearnRate(eta))
			for s := range steps {
				// rank r's rows: its two micro-batches [2rb, 2rb+b) and [2rb+b, 2rb+2b)
				err := n.NoSync(func() error {
					_, err := n.Step(ctx, shard(data[s], 2*r, b))
					return err
				})
				if err != nil {
					return err
				}
				if err := n.Apply(solver); err == nil || !strings.Contains(err.Error(), `"w`) {
					return fmt.Errorf("Apply after a NoSync step: %v; want an error naming the node", err)
				}
				if _, err := n.Step(ctx, shard(data[s], 2*r+1, b)); err != nil {
					return err
				}
				if err := n.Apply(solver); err != nil {
					return err
				}
			}
			weights[r] = valuesOf(net.params)
			return nil
		})
		for r := range world {
			if d := maxAbs(weights[r], refW); d > 1e-12 {
				t.Errorf("rank %d: weights differ by %.3g from one process", r, d)
			} else {
				t.Logf("accumulation, rank %d: max |weight - reference| %.3g", r, d)
			}
		}
	})
}

// TestGraphOwnTapeMachine: a loop that keeps its own TapeMachine with
// BindDualValues runs it between Prepare and Finish; Finish reduces after
// the run. Running it twice in one pass (gradients summed in the dual
// values) is refused, naming the node.
func TestGraphOwnTapeMachine(t *testing.T) {
	const world, b, steps, eta = 2, 4, 3, 0.1
	data := dataFor(plainNet(b*world, 1), steps, b*world, 5)
	_, refW := reference(t, plainNet(b*world, 1), data, eta, false)
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	weights := make([][][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		net := plainNet(b, 1)
		grads, err := G.Grad(net.loss, net.params...)
		if err != nil {
			return err
		}
		n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params, Grads: grads})
		if err != nil {
			return err
		}
		vm := G.NewTapeMachine(net.g, G.BindDualValues(net.params...))
		defer vm.Close()
		solver := G.NewVanillaSolver(G.WithLearnRate(eta))
		for s := range steps {
			p, err := n.Prepare(ctx)
			if err != nil {
				return err
			}
			for k, v := range shard(data[s], r, b) {
				G.Let(net.inputs[k], v)
			}
			if err := vm.RunAll(); err != nil {
				return err
			}
			vm.Reset()
			if err := p.Finish(ctx); err != nil {
				return err
			}
			if err := n.Apply(solver); err != nil {
				return err
			}
		}
		weights[r] = valuesOf(net.params)

		// Now two runs in one pass: the dual values hold their sum.
		p, err := n.Prepare(ctx)
		if err != nil {
			return err
		}
		for range 2 {
			if err := vm.RunAll(); err != nil {
				return err
			}
			vm.Reset()
		}
		err = p.Finish(ctx)
		if !errors.Is(err, ddp.ErrInvalidArgument) || !strings.Contains(err.Error(), `node "w`) || !strings.Contains(err.Error(), "accumulated") {
			return fmt.Errorf("Finish after two runs: %v; want the accumulated-gradient error naming the node", err)
		}
		return nil
	})
	for r := range world {
		if d := maxAbs(weights[r], refW); d > 1e-12 {
			t.Errorf("rank %d: weights differ by %.3g from one process", r, d)
		}
	}
}

// TestGraphAlternatingModels: two DDPs over one group trained in turn
// (a GAN's generator and discriminator steps), the second graph reading the
// first model's weights through shared tensors, match one process.
func TestGraphAlternatingModels(t *testing.T) {
	const world, b, steps, eta = 2, 3, 4, 0.05
	// Model D: score = tanh(x·wd)·vd, loss_d = mean(score²) on real data x.
	// Model G: fake = z·wg, loss_g = mean((tanh(fake·wd)·vd - 1)²): G's graph
	// reads D's weights (the same tensors), which G's step does not train.
	type pair struct {
		gd, gg           *G.ExprGraph
		lossD, lossG     *G.Node
		wd, vd, wg       *G.Node
		x, z             *G.Node
		wdInG, vdInG     *G.Node
		dParams, gParams G.Nodes
	}
	build := func(batch int, seed uint64) *pair {
		rng := rand.New(rand.NewPCG(seed, 4))
		p := &pair{gd: G.NewGraph(), gg: G.NewGraph()}
		wdT, vdT, wgT := randDense(rng, 0.5, 3, 4), randDense(rng, 0.5, 4, 1), randDense(rng, 0.5, 2, 3)
		p.x = G.NewMatrix(p.gd, G.Float64, G.WithShape(batch, 3), G.WithName("x"))
		p.wd = G.NewMatrix(p.gd, G.Float64, G.WithShape(3, 4), G.WithName("wd"), G.WithValue(wdT))
		p.vd = G.NewMatrix(p.gd, G.Float64, G.WithShape(4, 1), G.WithName("vd"), G.WithValue(vdT))
		score := G.Must(G.Mul(G.Must(G.Tanh(G.Must(G.Mul(p.x, p.wd)))), p.vd))
		p.lossD = G.Must(G.Mean(G.Must(G.Square(score))))
		p.z = G.NewMatrix(p.gg, G.Float64, G.WithShape(batch, 2), G.WithName("z"))
		p.wg = G.NewMatrix(p.gg, G.Float64, G.WithShape(2, 3), G.WithName("wg"), G.WithValue(wgT))
		p.wdInG = G.NewMatrix(p.gg, G.Float64, G.WithShape(3, 4), G.WithName("wd"), G.WithValue(wdT))
		p.vdInG = G.NewMatrix(p.gg, G.Float64, G.WithShape(4, 1), G.WithName("vd"), G.WithValue(vdT))
		fake := G.Must(G.Mul(p.z, p.wg))
		sg := G.Must(G.Mul(G.Must(G.Tanh(G.Must(G.Mul(fake, p.wdInG)))), p.vdInG))
		one := G.NewConstant(1.0)
		p.lossG = G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(sg, one))))))
		p.dParams, p.gParams = G.Nodes{p.wd, p.vd}, G.Nodes{p.wg}
		return p
	}
	rng := rand.New(rand.NewPCG(8, 8))
	xs, zs := make([]*tensor.Dense, steps), make([]*tensor.Dense, steps)
	for s := range steps {
		xs[s], zs[s] = randDense(rng, 1, b*world, 3), randDense(rng, 1, b*world, 2)
	}
	// One process on the whole batch.
	ref := build(b*world, 1)
	gD, _ := G.Grad(ref.lossD, ref.dParams...)
	gG, _ := G.Grad(ref.lossG, ref.gParams...)
	_, _ = gD, gG
	vmD := G.NewTapeMachine(ref.gd, G.BindDualValues(ref.dParams...))
	vmG := G.NewTapeMachine(ref.gg, G.BindDualValues(ref.gParams...))
	sD, sG := G.NewVanillaSolver(G.WithLearnRate(eta)), G.NewVanillaSolver(G.WithLearnRate(eta))
	for s := range steps {
		G.Let(ref.x, xs[s])
		if err := vmD.RunAll(); err != nil {
			t.Fatal(err)
		}
		vmD.Reset()
		if err := sD.Step(G.NodesToValueGrads(ref.dParams)); err != nil {
			t.Fatal(err)
		}
		G.Let(ref.z, zs[s])
		if err := vmG.RunAll(); err != nil {
			t.Fatal(err)
		}
		vmG.Reset()
		if err := sG.Step(G.NodesToValueGrads(ref.gParams)); err != nil {
			t.Fatal(err)
		}
	}
	refW := valuesOf(G.Nodes{ref.wd, ref.vd, ref.wg})

	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	weights := make([][][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		p := build(b, 1+uint64(r))
		dNet, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: p.gd, Loss: p.lossD, Params: p.dParams})
		if err != nil {
			return err
		}
		gNet, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: p.gg, Loss: p.lossG, Params: p.gParams, Inputs: G.Nodes{p.z}})
		if err != nil {
			return err
		}
		sD, sG := G.NewVanillaSolver(G.WithLearnRate(eta)), G.NewVanillaSolver(G.WithLearnRate(eta))
		for s := range steps {
			if _, err := dNet.Step(ctx, ddp.ByNode{p.x: rows2(xs[s], r*b, (r+1)*b)}); err != nil {
				return err
			}
			if err := dNet.Apply(sD); err != nil {
				return err
			}
			if _, err := gNet.Step(ctx, ddp.ByName{"z": rows2(zs[s], r*b, (r+1)*b)}); err != nil {
				return err
			}
			if err := gNet.Apply(sG, p.wg); err != nil {
				return err
			}
		}
		weights[r] = valuesOf(G.Nodes{p.wd, p.vd, p.wg})
		if err := gNet.Apply(sG, p.wdInG); err == nil || !strings.Contains(err.Error(), `node "wd" is unknown`) {
			return fmt.Errorf("Apply on the discriminator's weight through the generator's DDP: %v; want an error naming the node", err)
		}
		return nil
	})
	for r := range world {
		if d := maxAbs(weights[r], refW); d > 1e-12 {
			t.Errorf("rank %d: weights differ by %.3g from one process", r, d)
		} else {
			t.Logf("alternating models, rank %d: max |weight - reference| %.3g", r, d)
		}
	}
}

// TestGraphBadUse: each misuse fails with an error that names the node or
// parameter at fault.
func TestGraphBadUse(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	expect := func(t *testing.T, err error, sentinel error, parts ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("no error; want one mentioning %q", parts)
		}
		if !errors.Is(err, sentinel) {
			t.Errorf("error %v does not wrap %v", err, sentinel)
		}
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not mention %q", err, p)
			}
		}
	}
	t.Run("learnable node no gradient reaches", func(t *testing.T) {
		pgs := localWorld(t, 2)
		for r, err := range testkit.EachRank(2, func(r int) error {
			net := plainNet(4, 1)
			stray := G.NewMatrix(net.g, G.Float64, G.WithShape(2, 2), G.WithName("stray"), G.WithValue(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking(make([]float64, 4)))))
			_, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: append(net.params, stray)})
			return err
		}) {
			t.Run(fmt.Sprint("rank", r), func(t *testing.T) { expect(t, err, ddp.ErrInvalidArgument, `"stray"`, "FindUnusedParameters") })
		}
	})
	t.Run("unused node allowed with FindUnusedParameters", func(t *testing.T) {
		pgs := localWorld(t, 2)
		testkit.RequireEachRank(t, 2, func(r int) error {
			net := plainNet(4, 1)
			stray := G.NewMatrix(net.g, G.Float64, G.WithShape(2, 2), G.WithName("stray"), G.WithValue(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking(make([]float64, 4)))))
			n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: append(net.params, stray)}, ddp.FindUnusedParameters(true))
			if err != nil {
				return err
			}
			data := dataFor(net, 1, 4, 1)[0]
			if _, err := n.Step(ctx, ddp.ByName(data)); err != nil {
				return err
			}
			if n.Params()[2].Grad != nil {
				return fmt.Errorf("the unused node has a gradient")
			}
			return n.Apply(G.NewVanillaSolver())
		})
	})
	t.Run("different graphs", func(t *testing.T) {
		pgs := localWorld(t, 2)
		for r, err := range testkit.EachRank(2, func(r int) error {
			net := plainNet(4, 1)
			if r == 1 { // one more op on rank 1
				net.loss = G.Must(G.Mul(net.loss, G.NewConstant(2.0)))
			}
			_, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params})
			return err
		}) {
			t.Run(fmt.Sprint("rank", r), func(t *testing.T) { expect(t, err, ddp.ErrMismatch, "graphs differ", "rank 1") })
		}
	})
	t.Run("different parameter shapes", func(t *testing.T) {
		pgs := localWorld(t, 2)
		for r, err := range testkit.EachRank(2, func(r int) error {
			net := plainNet(4, 1)
			if r == 1 { // a learnable w2 of another shape (the graph's own w2 renamed)
				w := G.NewMatrix(net.g, G.Float64, G.WithShape(3, 3), G.WithName("w2"), G.WithValue(tensor.New(tensor.WithShape(3, 3), tensor.WithBacking(make([]float64, 9)))))
				net.loss = G.Must(G.Add(net.loss, G.Must(G.Sum(w))))
				net.params = G.Nodes{net.params[0], w}
			}
			_, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params})
			return err
		}) {
			t.Run(fmt.Sprint("rank", r), func(t *testing.T) {
				expect(t, err, ddp.ErrMismatch, "parameter w2 float64 [5 2] on rank 0", "parameter w2 float64 [3 3] on rank 1")
			})
		}
	})
	t.Run("feeds", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			feeds func(net *gnet) ddp.Feeds
			parts []string
		}{
			{"missing", func(net *gnet) ddp.Feeds {
				return ddp.ByName{"x": tensor.New(tensor.WithShape(4, 4), tensor.WithBacking(make([]float64, 16)))}
			}, []string{`no feed for input node "y"`}},
			{"wrong shape", func(net *gnet) ddp.Feeds {
				return ddp.ByNode{net.inputs["x"]: tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(make([]float64, 12))),
					net.inputs["y"]: tensor.New(tensor.WithShape(4, 2), tensor.WithBacking(make([]float64, 8)))}
			}, []string{`feed for node "x" is float64 (3, 4)`, "(4, 4)"}},
			{"unknown name", func(net *gnet) ddp.Feeds {
				return ddp.ByName{"q": tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{1}))}
			}, []string{`feed "q"`}},
			{"learnable node fed", func(net *gnet) ddp.Feeds {
				return ddp.ByName{"w1": tensor.New(tensor.WithShape(4, 5), tensor.WithBacking(make([]float64, 20)))}
			}, []string{`node "w1", which is learnable`}},
		} {
			t.Run(c.name, func(t *testing.T) {
				pgs := localWorld(t, 2)
				for r, err := range testkit.EachRank(2, func(r int) error {
					net := plainNet(4, 1)
					n, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: net.params})
					if err != nil {
						return fmt.Errorf("NewGraph: %w", err)
					}
					_, err = n.Step(ctx, c.feeds(net))
					if err == nil {
						return nil
					}
					if _, again := n.Step(ctx, c.feeds(net)); !errors.Is(again, ddp.ErrClosed) {
						return fmt.Errorf("second step after a failed one: %v, want ErrClosed", again)
					}
					return err
				}) {
					expect(t, err, ddp.ErrInvalidArgument, c.parts...)
					_ = r
				}
			})
		}
	})
	t.Run("solver and optimizer given unknown nodes", func(t *testing.T) {
		pgs := localWorld(t, 1)
		net := plainNet(4, 1)
		other := plainNet(4, 2)
		n, err := ddp.NewGraph(ctx, pgs[0], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: G.Nodes{net.params[0], net.params[1]}})
		if err != nil {
			t.Fatal(err)
		}
		expect(t, n.Apply(G.NewVanillaSolver()), ddp.ErrInvalidArgument, `"w1"`, "no reduced gradient")
		if _, err := n.Step(ctx, ddp.ByName(dataFor(net, 1, 4, 1)[0])); err != nil {
			t.Fatal(err)
		}
		expect(t, n.Apply(G.NewVanillaSolver(), other.params[0]), ddp.ErrInvalidArgument, `node "w1" is unknown`, "another graph")
		expect(t, n.Apply(G.NewVanillaSolver(), net.inputs["x"]), ddp.ErrInvalidArgument, `node "x" is unknown`, "listed as input")
		_, err = n.ParamsOf(net.params[0], other.params[1])
		expect(t, err, ddp.ErrInvalidArgument, `node "w2" is unknown`)
		if ps, err := n.ParamsOf(net.params[1]); err != nil || ps[0].Name != "w2" {
			t.Errorf("ParamsOf(w2) = %v, %v", ps, err)
		}
		if err := n.Apply(G.NewVanillaSolver(), net.params[1]); err != nil {
			t.Fatal(err)
		}
		expect(t, n.Apply(G.NewVanillaSolver(), net.params[1]), ddp.ErrInvalidArgument, `"w2" has no reduced gradient`)
		// A value replaced behind DDP's back.
		if err := G.Let(net.params[0], tensor.New(tensor.WithShape(4, 5), tensor.WithBacking(make([]float64, 20)))); err != nil {
			t.Fatal(err)
		}
		_, err = n.Step(ctx, ddp.ByName(dataFor(net, 1, 4, 1)[0]))
		expect(t, err, ddp.ErrInvalidArgument, `"w1" was replaced`)
	})
	t.Run("spec", func(t *testing.T) {
		pgs := localWorld(t, 1)
		net := plainNet(4, 1)
		_, err := ddp.NewGraph(ctx, pgs[0], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: G.Nodes{net.params[0], net.inputs["x"]}})
		expect(t, err, ddp.ErrInvalidArgument, `learnable node "x" holds <nil>`)
		_, err = ddp.NewGraph(ctx, pgs[0], ddp.GraphSpec{Graph: net.g, Loss: net.loss, Params: G.Nodes{net.params[0], net.params[0]}})
		expect(t, err, ddp.ErrInvalidArgument, `node "w1" is listed twice`)
	})
}
