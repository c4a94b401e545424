package dist

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
)

// The executor of package graph passes the run's context to collectives.
var _ graph.ContextDoer = (*collective)(nil)

// TestBuildErrors: malformed calls fail when the node is built, with an
// error wrapping ErrInvalidArgument that says what is wrong.
func TestBuildErrors(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	pg := localGroups(t, ctx, 3)[0]
	g := G.NewGraph()
	f := func(name string, shape ...int) *G.Node {
		return input(g, name, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(shape...)))
	}
	x := f("x", 2, 3)
	xi := input(g, "xi", tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(4)))
	ins := G.Nodes{f("a", 2), f("b", 2), f("c", 2)}
	other := G.NewGraph()
	elsewhere := input(other, "y", tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(2)))
	boolean := G.NewTensor(g, tensor.Bool, 1, G.WithShape(2), G.WithName("bool"))

	for _, c := range []struct {
		name  string
		build func() (any, error)
		want  string
	}{
		{"nil group", func() (any, error) { return AllReduce(nil, x, comm.Sum) }, "nil process group"},
		{"nil node", func() (any, error) { return AllReduce(pg, nil, comm.Sum) }, "nil node"},
		{"zero reduce op", func() (any, error) { return AllReduce(pg, x, comm.ReduceOp{}) }, "invalid reduce op"},
		{"bitwise on floats", func() (any, error) { return AllReduce(pg, x, comm.BXor) }, "integer tensors only"},
		{"fractional premul on ints", func() (any, error) { return Reduce(pg, xi, 0, comm.PremulSum(0.5)) }, "whole factor"},
		{"unsupported dtype", func() (any, error) { return AllReduce(pg, boolean, comm.Sum) }, "not supported"},
		{"broadcast root", func() (any, error) { return Broadcast(pg, x, 3) }, "root 3 is out of range"},
		{"reduce root", func() (any, error) { return Reduce(pg, x, -1, comm.Sum) }, "root -1 is out of range"},
		{"gather root", func() (any, error) { return Gather(pg, x, 7) }, "out of range"},
		{"scatter list length", func() (any, error) { return Scatter(pg, ins[:2], 0) }, "want one per rank (3)"},
		{"reduce_scatter list length", func() (any, error) { return ReduceScatter(pg, append(ins, x), comm.Sum) }, "want one per rank"},
		{"all_to_all shapes", func() (any, error) { return AllToAll(pg, G.Nodes{ins[0], ins[1], x}) }, "all need one shape"},
		{"mixed dtypes", func() (any, error) { return AllToAll(pg, G.Nodes{ins[0], ins[1], xi}) }, "one dtype"},
		{"two graphs", func() (any, error) { return Scatter(pg, G.Nodes{ins[0], ins[1], elsewhere}, 0) }, "not in the graph"},
		{"reduce_scatter_tensor blocks", func() (any, error) { return ReduceScatterTensor(pg, x, comm.Sum) }, "3 equal blocks"},
		{"all_to_all_single split count", func() (any, error) { return AllToAllSingle(pg, x, nil, []int{1, 1}) }, "2 input splits"},
		{"all_to_all_single negative split", func() (any, error) { return AllToAllSingle(pg, x, []int{0, 2, 0}, []int{3, -1, 0}) }, "negative"},
		{"all_to_all_single split sum", func() (any, error) { return AllToAllSingle(pg, x, []int{1, 1, 1}, []int{1, 1, 1}) }, "add up to 3 rows"},
		{"all_to_all_single self", func() (any, error) { return AllToAllSingle(pg, x, []int{0, 1, 1}, []int{2, 0, 0}) }, "sends itself 2 rows but expects 0"},
		{"all_to_all_single equal", func() (any, error) { return AllToAllSingle(pg, x, nil, nil) }, "do not divide into 3 equal parts"},
		{"all_to_all_single empty output", func() (any, error) { return AllToAllSingle(pg, x, []int{0, 0, 0}, []int{0, 1, 1}) }, "no elements"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.build()
			mustContain(t, err, c.want)
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("error %q does not wrap ErrInvalidArgument", err)
			}
		})
	}
}

// TestNonMember: a group handle this rank does not belong to cannot build
// collectives.
func TestNonMember(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	pgs := localGroups(t, ctx, 2)
	subs := make([]*comm.ProcessGroup, 2)
	mustRanks(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		color := 0
		if r == 1 {
			color = -1
		}
		var err error
		subs[r], err = pg.Split(ctx, color, 0)
		return err
	})
	g := G.NewGraph()
	x := input(g, "x", tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(2)))
	_, err := AllReduce(subs[1], x, comm.Sum)
	if !errors.Is(err, comm.ErrNotMember) {
		t.Fatalf("all_reduce on a group this rank is not in: %v, want ErrNotMember", err)
	}
	if _, err := AllReduce(subs[0], x, comm.Sum); err != nil {
		t.Fatalf("all_reduce on a one-rank group: %v", err)
	}
}

// TestNotDifferentiable: bitwise reductions, integer collectives and second
// derivatives of product, max and min refuse to be differentiated, naming the
// op and the reduce op.
func TestNotDifferentiable(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	pg := localGroups(t, ctx, 2)[0]
	ints := func(g *G.ExprGraph, name string) *G.Node {
		return input(g, name, tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(4)))
	}
	for _, red := range []comm.ReduceOp{comm.BAnd, comm.BOr, comm.BXor} {
		for _, op := range []string{"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"} {
			t.Run(op+"/"+red.String(), func(t *testing.T) {
				g := G.NewGraph()
				var y *G.Node
				var ins G.Nodes
				var err error
				switch op {
				case "all_reduce":
					ins = G.Nodes{ints(g, "x")}
					y, err = AllReduce(pg, ins[0], red)
				case "reduce":
					ins = G.Nodes{ints(g, "x")}
					y, err = Reduce(pg, ins[0], 1, red)
				case "reduce_scatter":
					ins = G.Nodes{ints(g, "a"), ints(g, "b")}
					y, err = ReduceScatter(pg, ins, red)
				case "reduce_scatter_tensor":
					ins = G.Nodes{ints(g, "x")}
					y, err = ReduceScatterTensor(pg, ins[0], red)
				}
				if err != nil {
					t.Fatal(err)
				}
				gy := input(g, "gy", tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(y.Shape().Clone()...)))
				_, err = G.Backpropagate(G.Nodes{y}, G.Nodes{gy}, ins)
				mustContain(t, err, op, red.String(), "bitwise", "no gradient")
				// The op's own error wraps the sentinel (gorgonia's wrapper
				// keeps only the message).
				_, err = y.Op().(G.SDOp).SymDiff(children(g, y), y, gy)
				if !errors.Is(err, ErrNotDifferentiable) {
					t.Errorf("SymDiff: %v, want ErrNotDifferentiable", err)
				}
			})
		}
	}
	t.Run("int64 all_gather", func(t *testing.T) {
		g := G.NewGraph()
		x := ints(g, "x")
		ys, err := AllGather(pg, x)
		if err != nil {
			t.Fatal(err)
		}
		gys := G.Nodes{ints(g, "g0"), ints(g, "g1")}
		_, err = G.Backpropagate(ys, gys, G.Nodes{x})
		mustContain(t, err, "all_gather", "int64", "no gradient")
	})
	for _, red := range []comm.ReduceOp{comm.Product, comm.Max, comm.Min} {
		t.Run("second derivative/"+red.String(), func(t *testing.T) {
			g := G.NewGraph()
			x := input(g, "x", tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(3)))
			y, err := AllReduce(pg, x, red)
			if err != nil {
				t.Fatal(err)
			}
			dx, err := G.Grad(G.Must(G.Sum(y)), x)
			if err != nil {
				t.Fatalf("first derivative: %v", err)
			}
			_, err = G.Grad(G.Must(G.Sum(dx[0])), x)
			mustContain(t, err, "second derivatives", red.String())
		})
	}
}

// TestCancellation: a collective whose peers never come ends with the run's
// context, and the run reports an error wrapping comm.ErrTimeout that names
// the node.
func TestCancellation(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	pgs := localGroups(t, ctx, 2)
	g := G.NewGraph()
	x := input(g, "x", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2})))
	y, err := AllReduce(pgs[0], x, comm.Sum)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := graph.Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = prog.Run(short) // rank 1 never joins
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("run without the peer: %v, want an error wrapping comm.ErrTimeout", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(y.Op())) {
		t.Errorf("error %q does not name the node's op %v", err, y.Op())
	}
}
