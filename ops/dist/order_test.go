package dist

import (
	"context"
	"fmt"
	"hash"
	"runtime"
	"testing"
	"time"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/opkit"
	"github.com/tandemml/tandem/internal/testkit"
)

// delayOp is a test op that waits (honouring the context) and then returns a
// copy of its input: placed on the inputs of collectives with rank-dependent
// delays, it makes a parallel executor reach independent collectives in
// different orders on different ranks.
type delayOp struct {
	name string
	d    time.Duration
}

func (op delayOp) Arity() int { return 1 }
func (op delayOp) Type() hm.Type {
	return hm.NewFnType(hm.TypeVariable('a'), hm.TypeVariable('a'))
}
func (op delayOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	return ds[0].(tensor.Shape).Clone(), nil
}
func (op delayOp) ReturnsPtr() bool      { return false }
func (op delayOp) CallsExtern() bool     { return false }
func (op delayOp) OverwritesInput() int  { return -1 }
func (op delayOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "delay:%s", op.name) }
func (op delayOp) Hashcode() uint32      { return opkit.Hash(op) }
func (op delayOp) String() string        { return "delay:" + op.name }
func (op delayOp) DiffWRT(n int) []bool  { return opkit.AllDiff(n) }
func (op delayOp) SymDiff(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	return G.Nodes{grad}, nil // the identity
}
func (op delayOp) Do(in ...G.Value) (G.Value, error) {
	return op.DoContext(context.Background(), nil, in...)
}
func (op delayOp) DoContext(ctx context.Context, _ G.Value, in ...G.Value) (G.Value, error) {
	t := time.NewTimer(op.d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return G.CloneValue(in[0])
}

func delay(x *G.Node, name string, d time.Duration) *G.Node {
	return G.Must(G.ApplyOp(delayOp{name: name, d: d}, x))
}

// TestTwoCollectivesOnOneInput: gorgonia merges nodes whose ops hash alike;
// two all-reduces of the same input must stay two nodes (two
// communications), and the second must not be the all-reduce of the first.
func TestTwoCollectivesOnOneInput(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	pgs := localGroups(t, ctx, 2)
	type rankGraph struct {
		g        *G.ExprGraph
		a, b, aa *G.Node
	}
	rgs := make([]rankGraph, 2)
	for r, pg := range pgs {
		g := G.NewGraph()
		x := input(g, "x", tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{1, 2, float64(r)})))
		a, err := AllReduce(pg, x, comm.Sum)
		if err != nil {
			t.Fatal(err)
		}
		b, err := AllReduce(pg, x, comm.Sum)
		if err != nil {
			t.Fatal(err)
		}
		aa, err := AllReduce(pg, a, comm.Sum)
		if err != nil {
			t.Fatal(err)
		}
		if a == b || a.Hashcode() == b.Hashcode() || a.Op().Hashcode() == b.Op().Hashcode() {
			t.Fatalf("two all-reduces of one input were merged (%v, %v)", a.Op(), b.Op())
		}
		if n := countCollectives(g); n != 3 {
			t.Fatalf("graph holds %d collective nodes, want 3", n)
		}
		// The chain: b follows a through an ordering edge, and aa follows b
		// (it reads a as data).
		if op := b.Op().(*collective); !op.ordered || op.seq != 1 {
			t.Errorf("second all-reduce: ordered=%t seq=%d, want true 1", op.ordered, op.seq)
		}
		if op := aa.Op().(*collective); !op.ordered || op.seq != 2 {
			t.Errorf("third all-reduce: ordered=%t seq=%d, want true 2", op.ordered, op.seq)
		}
		rgs[r] = rankGraph{g, a, b, aa}
	}
	mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
		rg := rgs[r]
		prog, err := graph.Compile(rg.g, graph.Workers(4))
		if err != nil {
			return err
		}
		if err := prog.Run(ctx); err != nil {
			return err
		}
		for _, c := range []struct {
			n    *G.Node
			want []float64
		}{{rg.a, []float64{2, 4, 1}}, {rg.b, []float64{2, 4, 1}}, {rg.aa, []float64{4, 8, 2}}} {
			got, err := flatFloats(prog.Value(c.n))
			if err != nil {
				return err
			}
			if err := closeTo(got, c.want, 0); err != nil {
				return fmt.Errorf("%v: %w", c.n.Op(), err)
			}
		}
		return nil
	})
}

func countCollectives(g *G.ExprGraph) int {
	n := 0
	for _, nd := range g.AllNodes() {
		if _, ok := nd.Op().(*collective); ok {
			n++
		}
	}
	return n
}

// TestChainsPerGroup: collectives of different groups are not ordered with
// each other, and the same call on two groups gives two nodes.
func TestChainsPerGroup(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	a := localGroups(t, ctx, 2)
	b := localGroups(t, ctx, 2)
	g := G.NewGraph()
	x := input(g, "x", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2})))
	ya, err := AllReduce(a[0], x, comm.Sum)
	if err != nil {
		t.Fatal(err)
	}
	yb, err := AllReduce(b[0], x, comm.Sum)
	if err != nil {
		t.Fatal(err)
	}
	if ya == yb {
		t.Fatal("all-reduces of one input on two groups were merged")
	}
	if op := yb.Op().(*collective); op.ordered || op.seq != 0 {
		t.Errorf("first collective of group b: ordered=%t seq=%d, want false 0", op.ordered, op.seq)
	}
	za, err := Broadcast(a[0], x, 1)
	if err != nil {
		t.Fatal(err)
	}
	if kids := children(g, za); len(kids) != 2 || kids[1] != ya {
		t.Errorf("second collective of group a reads %v, want x and the ordering edge to %v", kids, ya)
	}
}

// TestOrderUnderParallelExecutor builds independent collectives of different
// shapes and delays their inputs so that a parallel executor reaches them in
// opposite orders on the two ranks, forward and backward. Issued in the order
// reached, they would pair the wrong operations (a fingerprint mismatch);
// the ordering chain makes every rank issue them in the order built.
func TestOrderUnderParallelExecutor(t *testing.T) {
	const k = 4
	const step = 15 * time.Millisecond
	ctx := ctxFor(t, time.Minute)
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("w%d", world), func(t *testing.T) {
			pgs := localGroups(t, ctx, world)
			type rankGraph struct {
				g            *G.ExprGraph
				xs, ys, dxs  G.Nodes
				xvals, gvals [][]float64
			}
			rgs := make([]rankGraph, world)
			for r, pg := range pgs {
				rg := rankGraph{g: G.NewGraph()}
				var gs G.Nodes
				for i := 0; i < k; i++ {
					// Rank 0 reaches the last collective first, the others
					// the first one first; the gradients arrive the other way.
					di, dg := time.Duration(k-1-i)*step, time.Duration(i)*step
					if r > 0 {
						di, dg = dg, di
					}
					xv, gv := make([]float64, i+1), make([]float64, i+1)
					for j := range xv {
						xv[j], gv[j] = float64(10*r+i+j), float64(r+1)*float64(j+1)
					}
					rg.xvals, rg.gvals = append(rg.xvals, xv), append(rg.gvals, gv)
					x := input(rg.g, fmt.Sprintf("x%d", i), tensor.New(tensor.WithShape(i+1), tensor.WithBacking(xv)))
					gin := input(rg.g, fmt.Sprintf("g%d", i), tensor.New(tensor.WithShape(i+1), tensor.WithBacking(gv)))
					y, err := AllReduce(pg, delay(x, fmt.Sprintf("x%d", i), di), comm.Sum)
					if err != nil {
						t.Fatal(err)
					}
					rg.xs, rg.ys = append(rg.xs, x), append(rg.ys, y)
					gs = append(gs, delay(gin, fmt.Sprintf("g%d", i), dg))
				}
				var err error
				if rg.dxs, err = G.Backpropagate(rg.ys, gs, rg.xs); err != nil {
					t.Fatal(err)
				}
				rgs[r] = rg
			}
			mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
				rg := rgs[r]
				prog, err := graph.Compile(rg.g, graph.Workers(4*k))
				if err != nil {
					return err
				}
				if err := prog.Run(ctx); err != nil {
					return err
				}
				for i := 0; i < k; i++ {
					wantY, wantDX := make([]float64, i+1), make([]float64, i+1)
					for q := range rgs {
						for j := range wantY {
							wantY[j] += rgs[q].xvals[i][j]
							wantDX[j] += rgs[q].gvals[i][j]
						}
					}
					y, _ := flatFloats(prog.Value(rg.ys[i]))
					dx, _ := flatFloats(prog.Value(rg.dxs[i]))
					if err := closeTo(y, wantY, 0); err != nil {
						return fmt.Errorf("y%d: %w", i, err)
					}
					if err := closeTo(dx, wantDX, 0); err != nil {
						return fmt.Errorf("dx%d: %w", i, err)
					}
				}
				return nil
			})
		})
	}
}

// children returns n's children in argument order.
func children(g *G.ExprGraph, n *G.Node) G.Nodes {
	var out G.Nodes
	it := g.From(n.ID())
	for it.Next() {
		out = append(out, it.Node().(*G.Node))
	}
	return out
}

// TestNoGoroutinesLeft: running collective nodes leaves no goroutine behind
// once the runs have returned and the groups are closed.
func TestNoGoroutinesLeft(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs, err := local.NewGroups(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	progs := make([]*graph.Program, len(pgs))
	for r, pg := range pgs {
		g := G.NewGraph()
		x := input(g, "x", tensor.New(tensor.WithShape(4), tensor.WithBacking([]float64{1, 2, 3, float64(r)})))
		parts, err := AllGather(pg, x)
		if err != nil {
			t.Fatal(err)
		}
		y, err := AllReduce(pg, parts[1], comm.Max)
		if err != nil {
			t.Fatal(err)
		}
		grads, err := G.Grad(G.Must(G.Sum(y)), x)
		if err != nil {
			t.Fatal(err)
		}
		if progs[r], err = graph.Compile(g, graph.WithGrads(G.Nodes{x}, grads)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error { return progs[r].Run(ctx) })
	}
	closeAll(pgs)
	testkit.RequireNoLeak(t, before)
}
