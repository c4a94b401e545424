package dist

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
)

// TestFiniteDifferences checks the gradient of the global objective
// L = sum_r <y_r, g_r> of every op and every float reduce op, for worlds of 2
// to 5 ranks, against central differences: one element of one rank's input is
// moved by ±h, every rank runs its forward pass again, and the ranks'
// objectives are summed. Every function here is multilinear or piecewise
// linear in each input, so the differences are exact up to rounding.
func TestFiniteDifferences(t *testing.T) {
	ops := []string{"broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather",
		"scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"}
	reducing := map[string]bool{"all_reduce": true, "reduce": true, "reduce_scatter": true, "reduce_scatter_tensor": true}
	reds := []string{"sum", "avg", "premul_sum", "product", "min", "max"}
	ctx := ctxFor(t, 2*time.Minute)
	for world := 2; world <= 5; world++ {
		pgs := localGroups(t, ctx, world)
		for _, op := range ops {
			rs := []string{""}
			if reducing[op] {
				rs = reds
			}
			for _, red := range rs {
				name := fmt.Sprintf("w%d/%s", world, op)
				if red != "" {
					name += "/" + red
				}
				t.Run(name, func(t *testing.T) {
					seed := uint64(world*1000 + len(name))
					fdCheck(t, ctx, pgs, fdSpec(op, red, world, seed), seed, false)
				})
				if world == 3 && op != "reduce_scatter_tensor" && op != "all_to_all_single" {
					// Scalar nodes (shape ()): gorgonia gives them scalar values.
					t.Run(name+"/scalar", func(t *testing.T) {
						seed := uint64(world*1000 + len(name))
						fdCheck(t, ctx, pgs, fdSpec(op, red, world, seed), seed, true)
					})
				}
			}
		}
	}
}

// fdSpec describes a case in the fixture format, so that fixtureCase.apply
// builds it.
func fdSpec(op, red string, world int, seed uint64) fixtureCase {
	rng := rand.New(rand.NewPCG(seed, 7))
	c := fixtureCase{Name: op, Op: op, World: world, Dtype: "float64"}
	if red != "" {
		c.ReduceOp = &red
		if red == "premul_sum" {
			f := 0.75
			c.Factor = &f
		}
	}
	root := rng.IntN(world)
	c.Src, c.Dst = &root, &root
	if op == "all_to_all_single" {
		c.InputSplitSizes = make([][]int, world)
		for r := range c.InputSplitSizes {
			c.InputSplitSizes[r] = make([]int, world)
			for j := range c.InputSplitSizes[r] {
				c.InputSplitSizes[r][j] = rng.IntN(3)
			}
			c.InputSplitSizes[r][r] = 1 + rng.IntN(2)
		}
	}
	return c
}

// fdInputShapes returns the shapes of rank r's inputs for the case.
func fdInputShapes(c fixtureCase, r int, scalar bool) []tensor.Shape {
	w := c.World
	if scalar {
		n := 1
		if c.Op == "scatter" || c.Op == "reduce_scatter" || c.Op == "all_to_all" {
			n = w
		}
		return make([]tensor.Shape, n) // shape () each
	}
	switch c.Op {
	case "scatter", "reduce_scatter", "all_to_all":
		s := make([]tensor.Shape, w)
		for i := range s {
			s[i] = tensor.Shape{2}
		}
		return s
	case "reduce_scatter_tensor":
		return []tensor.Shape{{w, 2}}
	case "all_to_all_single":
		rows := 0
		for _, v := range c.InputSplitSizes[r] {
			rows += v
		}
		return []tensor.Shape{{rows, 2}}
	}
	return []tensor.Shape{{2, 3}}
}

// fdRank is one rank's two graphs: one differentiated (run once), one
// forward-only (run for every difference).
type fdRank struct {
	g         *G.ExprGraph
	ins       G.Nodes
	gradNodes G.Nodes
	fwd       *graph.Program
	fwdIns    G.Nodes
	fwdCost   *G.Node
	grads     []G.Value
}

func fdCheck(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, c fixtureCase, seed uint64, scalar bool) {
	rng := rand.New(rand.NewPCG(seed, 11))
	w := c.World
	// Inputs and output gradients of every rank. Min and max need values
	// that are far apart compared with h, so that moving one does not change
	// which rank holds the extreme.
	vals := make([][]*tensor.Dense, w)
	for r := range vals {
		for _, s := range fdInputShapes(c, r, scalar) {
			vals[r] = append(vals[r], randTensor(rng, s))
		}
	}
	if c.ReduceOp != nil && (*c.ReduceOp == "min" || *c.ReduceOp == "max") {
		spreadValues(rng, vals)
	}
	// Build one rank at a time, then run the differentiated graphs together.
	ranks := make([]*fdRank, w)
	for r, pg := range pgs {
		var err error
		if ranks[r], err = fdBuild(c, r, pg, vals[r], seed); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
		fr := ranks[r]
		gvals, err := dataflow.run(ctx, fr.g, fr.ins, fr.gradNodes)
		if err != nil {
			return err
		}
		for _, v := range gvals {
			c, err := G.CloneValue(v)
			if err != nil {
				return err
			}
			fr.grads = append(fr.grads, c)
		}
		return nil
	})

	// Central differences at a sample of coordinates covering every rank.
	const h = 1e-3
	type coord struct{ r, k, i int }
	var coords []coord
	for r := range vals {
		for n := 0; n < 3; n++ {
			k := rng.IntN(len(vals[r]))
			size := vals[r][k].Shape().TotalSize()
			if size == 0 {
				continue
			}
			coords = append(coords, coord{r, k, rng.IntN(size)})
		}
	}
	for _, co := range coords {
		x := vals[co.r][co.k].Float64s()
		orig := x[co.i]
		x[co.i] = orig + h
		lp := fdObjective(t, ctx, pgs, ranks, vals)
		x[co.i] = orig - h
		lm := fdObjective(t, ctx, pgs, ranks, vals)
		x[co.i] = orig
		num := (lp - lm) / (2 * h)
		got, err := flatFloats(ranks[co.r].grads[co.k])
		if err != nil {
			t.Fatal(err)
		}
		if d := math.Abs(got[co.i] - num); d > 1e-8*math.Max(1, math.Abs(num)) {
			t.Errorf("rank %d input %d element %d: gradient %v, central difference %v (off by %g)", co.r, co.k, co.i, got[co.i], num, d)
		}
	}
}

// fdBuild builds rank r's two graphs and compiles the forward one.
func fdBuild(c fixtureCase, r int, pg *comm.ProcessGroup, vals []*tensor.Dense, seed uint64) (*fdRank, error) {
	build := func() (*G.ExprGraph, G.Nodes, *G.Node, error) {
		rng := rand.New(rand.NewPCG(seed, uint64(100+r))) // the same output gradients in both graphs
		g := G.NewGraph()
		ins := make(G.Nodes, len(vals))
		for k, v := range vals {
			ins[k] = input(g, fmt.Sprintf("in%d", k), v.Clone().(*tensor.Dense))
		}
		outs, err := c.apply(pg, r, ins)
		if err != nil {
			return nil, nil, nil, err
		}
		gs := make(G.Nodes, len(outs))
		for k, o := range outs {
			gs[k] = input(g, fmt.Sprintf("gy%d", k), randTensor(rng, o.Shape()))
		}
		cost, err := objective(outs, gs)
		return g, ins, cost, err
	}
	fr := &fdRank{}
	var cost *G.Node
	var err error
	if fr.g, fr.ins, cost, err = build(); err != nil {
		return nil, err
	}
	if fr.gradNodes, err = G.Grad(cost, fr.ins...); err != nil {
		return nil, fmt.Errorf("differentiating: %w", err)
	}
	g2, ins2, cost2, err := build()
	if err != nil {
		return nil, err
	}
	if fr.fwd, err = graph.Compile(g2); err != nil {
		return nil, err
	}
	fr.fwdIns, fr.fwdCost = ins2, cost2
	return fr, nil
}

// fdObjective runs every rank's forward graph on vals and sums the ranks'
// objectives.
func fdObjective(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, ranks []*fdRank, vals [][]*tensor.Dense) float64 {
	t.Helper()
	costs := make([]float64, len(ranks))
	mustRanks(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		fr := ranks[r]
		var bs []graph.Binding
		for k, n := range fr.fwdIns {
			bs = append(bs, graph.Bind(n, vals[r][k].Clone()))
		}
		if err := fr.fwd.Run(ctx, bs...); err != nil {
			return err
		}
		v, err := flatFloats(fr.fwd.Value(fr.fwdCost))
		if err != nil {
			return err
		}
		costs[r] = v[0]
		return nil
	})
	sum := 0.0
	for _, c := range costs {
		sum += c
	}
	return sum
}

func randTensor(rng *rand.Rand, s tensor.Shape) *tensor.Dense {
	b := make([]float64, s.TotalSize())
	for i := range b {
		b[i] = rng.NormFloat64()
	}
	if len(s) == 0 {
		return tensor.New(tensor.WithShape(), tensor.WithBacking(b))
	}
	return tensor.New(tensor.WithShape(s.Clone()...), tensor.WithBacking(b))
}

// spreadValues replaces the values so that, at every position, the ranks'
// values (and the values of one rank's several inputs) differ by at least
// 0.1: each is a distinct multiple of 0.25 plus a little noise.
func spreadValues(rng *rand.Rand, vals [][]*tensor.Dense) {
	var all [][]float64
	for _, rv := range vals {
		for _, v := range rv {
			all = append(all, v.Float64s())
		}
	}
	n := 0
	for _, a := range all {
		n = max(n, len(a))
	}
	for i := 0; i < n; i++ {
		perm := rng.Perm(len(all))
		for j, a := range all {
			if i < len(a) {
				a[i] = 0.25*float64(perm[j]-len(all)/2) + 0.05*rng.Float64()
			}
		}
	}
}
