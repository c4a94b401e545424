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
)

// TestTiesAndZeros checks the reductions that are not linear where finite
// differences cannot: values drawn from {0, 1, 2}, so that max and min are
// often tied (the gradient is shared equally among the ranks holding the
// extreme) and products often hold zeros (the gradient is the product of the
// other values, exact, with no division). Every reducing op is checked
// against a direct computation of the gradient of sum_r <y_r, g_r>.
func TestTiesAndZeros(t *testing.T) {
	const n = 12 // elements per rank's block
	ctx := ctxFor(t, time.Minute)
	for _, world := range []int{2, 3, 4} {
		pgs := localGroups(t, ctx, world)
		for _, op := range []string{"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"} {
			for _, red := range []string{"max", "min", "product"} {
				t.Run(fmt.Sprintf("w%d/%s/%s", world, op, red), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(world), uint64(len(op)*10+len(red))))
					c := fdSpec(op, red, world, uint64(world*7+len(red)))
					blocks := 1
					if op == "reduce_scatter" || op == "reduce_scatter_tensor" {
						blocks = world
					}
					// xs[r][b][i]: rank r's value of element i of block b.
					xs := make([][][]float64, world)
					for r := range xs {
						xs[r] = make([][]float64, blocks)
						for b := range xs[r] {
							xs[r][b] = make([]float64, n)
							for i := range xs[r][b] {
								xs[r][b][i] = float64(rng.IntN(3))
							}
						}
					}
					checkReduction(t, ctx, pgs, c, xs, rng)
				})
			}
		}
	}
}

// checkReduction runs case c on values xs and compares outputs and
// gradients with the definitions.
func checkReduction(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, c fixtureCase, xs [][][]float64, rng *rand.Rand) {
	world, blocks, n := len(xs), len(xs[0]), len(xs[0][0])
	red, err := c.reduceOp()
	if err != nil {
		t.Fatal(err)
	}
	// Each rank's output: one block of n (reduce_scatter: block r).
	gys := make([][]float64, world)
	for r := range gys {
		gys[r] = make([]float64, n)
		for i := range gys[r] {
			gys[r][i] = rng.NormFloat64()
		}
	}
	reduceAt := func(b, i int) (y float64, w []float64) {
		vals := make([]float64, world)
		for q := range vals {
			vals[q] = xs[q][b][i]
		}
		w = make([]float64, world)
		switch red.Kind() {
		case comm.KindProduct:
			y = 1
			for _, v := range vals {
				y *= v
			}
			for q := range w {
				w[q] = 1
				for p, v := range vals {
					if p != q {
						w[q] *= v
					}
				}
			}
		default:
			y = vals[0]
			for _, v := range vals {
				if (red.Kind() == comm.KindMax) == (v > y) && v != y {
					y = v
				}
			}
			count := 0
			for _, v := range vals {
				if v == y {
					count++
				}
			}
			for q, v := range vals {
				if v == y {
					w[q] = 1 / float64(count)
				}
			}
		}
		return y, w
	}
	wantY := make([][]float64, world)
	wantDX := make([][][]float64, world)
	for r := range wantDX {
		wantY[r] = make([]float64, n)
		wantDX[r] = make([][]float64, blocks)
		for b := range wantDX[r] {
			wantDX[r][b] = make([]float64, n)
		}
	}
	for i := 0; i < n; i++ {
		switch c.Op {
		case "all_reduce":
			y, w := reduceAt(0, i)
			sum := 0.0
			for r := range gys {
				wantY[r][i] = y
				sum += gys[r][i]
			}
			for q := range w {
				wantDX[q][0][i] = sum * w[q]
			}
		case "reduce":
			y, w := reduceAt(0, i)
			wantY[*c.Dst][i] = y
			for q := range w {
				wantDX[q][0][i] = gys[*c.Dst][i] * w[q]
			}
		default: // reduce_scatter(_tensor): rank k's output reduces block k
			for k := 0; k < world; k++ {
				y, w := reduceAt(k, i)
				wantY[k][i] = y
				for q := range w {
					wantDX[q][k][i] = gys[k][i] * w[q]
				}
			}
		}
	}

	type rankGraph struct {
		g       *G.ExprGraph
		ins     G.Nodes
		y       *G.Node
		dx      G.Nodes
		stacked bool
	}
	rgs := make([]rankGraph, world)
	for r, pg := range pgs {
		g := G.NewGraph()
		var ins G.Nodes
		switch c.Op {
		case "reduce_scatter":
			for b := 0; b < blocks; b++ {
				ins = append(ins, input(g, fmt.Sprintf("x%d", b), tensor.New(tensor.WithShape(n), tensor.WithBacking(append([]float64(nil), xs[r][b]...)))))
			}
		case "reduce_scatter_tensor":
			var all []float64
			for b := 0; b < blocks; b++ {
				all = append(all, xs[r][b]...)
			}
			ins = G.Nodes{input(g, "x", tensor.New(tensor.WithShape(blocks*n), tensor.WithBacking(all)))}
		default:
			ins = G.Nodes{input(g, "x", tensor.New(tensor.WithShape(n), tensor.WithBacking(append([]float64(nil), xs[r][0]...))))}
		}
		outs, err := c.apply(pg, r, ins)
		if err != nil {
			t.Fatal(err)
		}
		gy := input(g, "gy", tensor.New(tensor.WithShape(n), tensor.WithBacking(gys[r])))
		cost, err := objective(outs, G.Nodes{gy})
		if err != nil {
			t.Fatal(err)
		}
		dx, err := G.Grad(cost, ins...)
		if err != nil {
			t.Fatal(err)
		}
		rgs[r] = rankGraph{g: g, ins: ins, y: outs[0], dx: dx, stacked: c.Op == "reduce_scatter_tensor"}
	}
	mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
		rg := rgs[r]
		dxv, err := dataflow.run(ctx, rg.g, rg.ins, rg.dx)
		if err != nil {
			return err
		}
		y, _ := flatFloats(rg.y.Value())
		if err := closeTo(y, wantY[r], 0); err != nil {
			return fmt.Errorf("output: %w", err)
		}
		var got, want []float64
		for b := range wantDX[r] {
			want = append(want, wantDX[r][b]...)
		}
		for _, v := range dxv {
			vals, err := flatFloats(v)
			if err != nil {
				return err
			}
			got = append(got, vals...)
		}
		if err := closeTo(got, want, 1e-15); err != nil {
			return fmt.Errorf("gradient (values %v): %w", xs, err)
		}
		return nil
	})
}

// TestNaNIsTheExtreme: max and min propagate NaN, so the ranks holding NaN
// share the gradient.
func TestNaNIsTheExtreme(t *testing.T) {
	nan := math.NaN()
	vals := []float64{1, nan, nan}
	for _, max := range []bool{true, false} {
		red := comm.Min
		if max {
			red = comm.Max
		}
		for q, want := range []float64{0, 0.5, 0.5} {
			got, err := weight(vals, q, red)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%v: weight of rank %d among %v is %v, want %v", red, q, vals, got, want)
			}
		}
	}
}
