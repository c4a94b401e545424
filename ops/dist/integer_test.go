package dist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
)

// TestIntegerForward runs every op forward on integer tensors. Small values
// make every result exact in float64, so the float64 run of the same op on
// the same values (checked against PyTorch by the fixtures) is the
// reference; avg truncates toward zero on integers. The bitwise reductions
// have no float counterpart and are checked against a direct computation.
func TestIntegerForward(t *testing.T) {
	const world = 3
	ctx := ctxFor(t, time.Minute)
	pgs := localGroups(t, ctx, world)
	ops := []string{"broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather",
		"scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"}
	reducing := map[string]bool{"all_reduce": true, "reduce": true, "reduce_scatter": true, "reduce_scatter_tensor": true}
	for _, dt := range []tensor.Dtype{tensor.Int64, tensor.Int32, tensor.Uint8} {
		for _, op := range ops {
			reds := []string{""}
			if reducing[op] {
				reds = []string{"sum", "avg", "product", "min", "max", "band", "bor", "bxor"}
			}
			for _, red := range reds {
				t.Run(fmt.Sprintf("%v/%s/%s", dt, op, red), func(t *testing.T) {
					c := fdSpec(op, red, world, uint64(len(op)+len(red)))
					if red == "" {
						c.ReduceOp = nil
					}
					checkIntegerForward(t, ctx, pgs, c, dt)
				})
			}
		}
	}
}

func checkIntegerForward(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, c fixtureCase, dt tensor.Dtype) {
	world := len(pgs)
	rng := rand.New(rand.NewPCG(uint64(len(c.Name)), 99))
	lo, hi := -3, 4
	if dt == tensor.Uint8 {
		lo = 0
	}
	// vals[r][k]: rank r's k-th input as int64s.
	vals := make([][][]int64, world)
	shapes := make([][]tensor.Shape, world)
	for r := range vals {
		shapes[r] = fdInputShapes(c, r, false)
		for _, s := range shapes[r] {
			v := make([]int64, s.TotalSize())
			for i := range v {
				v[i] = int64(lo + rng.IntN(hi-lo))
			}
			vals[r] = append(vals[r], v)
		}
	}
	bitwise := c.ReduceOp != nil && (*c.ReduceOp == "band" || *c.ReduceOp == "bor" || *c.ReduceOp == "bxor")

	type rankGraph struct {
		gi, gf     *G.ExprGraph
		outI, outF G.Nodes
	}
	rgs := make([]rankGraph, world)
	for r, pg := range pgs {
		var rg rankGraph
		var err error
		rg.gi = G.NewGraph()
		var insI G.Nodes
		for k, v := range vals[r] {
			insI = append(insI, input(rg.gi, fmt.Sprintf("x%d", k), intTensor(dt, shapes[r][k], v)))
		}
		if rg.outI, err = c.apply(pg, r, insI); err != nil {
			t.Fatal(err)
		}
		if !bitwise {
			rg.gf = G.NewGraph()
			var insF G.Nodes
			for k, v := range vals[r] {
				f := make([]float64, len(v))
				for i, x := range v {
					f[i] = float64(x)
				}
				insF = append(insF, input(rg.gf, fmt.Sprintf("x%d", k), tensor.New(tensor.WithShape(shapes[r][k]...), tensor.WithBacking(f))))
			}
			if rg.outF, err = c.apply(pg, r, insF); err != nil {
				t.Fatal(err)
			}
		}
		rgs[r] = rg
	}
	mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
		rg := rgs[r]
		for _, g := range []*G.ExprGraph{rg.gi, rg.gf} {
			if g == nil {
				continue
			}
			prog, err := graph.Compile(g, graph.Workers(2))
			if err != nil {
				return err
			}
			if err := prog.Run(ctx); err != nil {
				return err
			}
		}
		for k, o := range rg.outI {
			got, err := ints(o.Value())
			if err != nil {
				return err
			}
			var want []int64
			if bitwise {
				want = bitwiseReference(c, vals, r, k)
			} else {
				f, err := flatFloats(rg.outF[k].Value())
				if err != nil {
					return err
				}
				for _, x := range f {
					if c.ReduceOp != nil && *c.ReduceOp == "avg" {
						x = float64(int64(x)) // truncation, as integer division does
					}
					want = append(want, wrap(dt, int64(x)))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("output %d: got %v, want %v (inputs %v)", k, got, want, vals)
			}
		}
		return nil
	})
}

// bitwiseReference is output k of rank r of a bitwise reduction.
func bitwiseReference(c fixtureCase, vals [][][]int64, r, k int) []int64 {
	world := len(vals)
	fold := func(get func(q int) []int64) []int64 {
		out := append([]int64(nil), get(0)...)
		for q := 1; q < world; q++ {
			for i, x := range get(q) {
				switch *c.ReduceOp {
				case "band":
					out[i] &= x
				case "bor":
					out[i] |= x
				case "bxor":
					out[i] ^= x
				}
			}
		}
		return out
	}
	switch c.Op {
	case "all_reduce":
		return fold(func(q int) []int64 { return vals[q][0] })
	case "reduce":
		y := fold(func(q int) []int64 { return vals[q][0] })
		if r != *c.Dst {
			clear(y)
		}
		return y
	case "reduce_scatter":
		return fold(func(q int) []int64 { return vals[q][r] })
	case "reduce_scatter_tensor":
		n := len(vals[0][0]) / world
		return fold(func(q int) []int64 { return vals[q][0][r*n : (r+1)*n] })
	}
	panic("no bitwise reference for " + c.Op)
}

func intTensor(dt tensor.Dtype, s tensor.Shape, v []int64) *tensor.Dense {
	buf := newFlat(dt, len(v))
	for i, x := range v {
		switch b := buf.(type) {
		case []int64:
			b[i] = x
		case []int32:
			b[i] = int32(x)
		case []uint8:
			b[i] = uint8(x)
		}
	}
	return tensor.New(tensor.WithShape(s.Clone()...), tensor.WithBacking(buf))
}

// wrap is x converted to dt and back, as the dtype's arithmetic wraps.
func wrap(dt tensor.Dtype, x int64) int64 {
	switch dt {
	case tensor.Int32:
		return int64(int32(x))
	case tensor.Uint8:
		return int64(uint8(x))
	}
	return x
}

func ints(v G.Value) ([]int64, error) {
	buf, _, err := flatOf(v)
	if err != nil {
		return nil, err
	}
	var out []int64
	switch b := buf.(type) {
	case []int64:
		out = append(out, b...)
	case []int32:
		for _, x := range b {
			out = append(out, int64(x))
		}
	case []uint8:
		for _, x := range b {
			out = append(out, int64(x))
		}
	default:
		return nil, fmt.Errorf("%T is not an integer buffer", buf)
	}
	return out, nil
}
