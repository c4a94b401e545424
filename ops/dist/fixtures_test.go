package dist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// The golden cases come from PyTorch (see testdata/dist_nn/cases.json and
// /work/shared/fixtures/README.md for the format). TANDEM_FIXTURES points the
// test at another folder laid out the same way.

type fixtureFile struct {
	Format    int           `json:"format"`
	Semantics string        `json:"semantics"`
	Cases     []fixtureCase `json:"cases"`
}

type fixtureCase struct {
	Name            string            `json:"name"`
	Op              string            `json:"op"`
	World           int               `json:"world"`
	Dtype           string            `json:"dtype"`
	ReduceOp        *string           `json:"reduce_op"`
	Factor          *float64          `json:"factor"`
	Src             *int              `json:"src"`
	Dst             *int              `json:"dst"`
	InputSplitSizes [][]int           `json:"input_split_sizes"`
	Inputs          [][]fixtureTensor `json:"inputs"`
	Outputs         [][]fixtureTensor `json:"outputs"`
	GradOutputs     [][]fixtureTensor `json:"grad_outputs"`
	InputGrads      [][]fixtureTensor `json:"input_grads"`
}

type fixtureTensor struct {
	Shape []int         `json:"shape"`
	Data  []json.Number `json:"data"`
}

func fixturePath() string {
	if dir := os.Getenv("TANDEM_FIXTURES"); dir != "" {
		return filepath.Join(dir, "dist_nn", "cases.json")
	}
	return filepath.Join("testdata", "dist_nn", "cases.json")
}

func loadFixtures(t *testing.T) []fixtureCase {
	t.Helper()
	path := fixturePath()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the fixtures: %v", err)
	}
	var f fixtureFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if f.Format != 1 {
		t.Fatalf("%s: format %d, this test reads format 1", path, f.Format)
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s holds no cases", path)
	}
	return f.Cases
}

func fixtureDtype(s string) (tensor.Dtype, float64, error) {
	switch s {
	case "float64":
		return tensor.Float64, 1e-12, nil
	case "float32":
		return tensor.Float32, 1e-5, nil
	case "int64":
		return tensor.Int64, 0, nil
	case "int32":
		return tensor.Int32, 0, nil
	case "int8":
		return tensor.Int8, 0, nil
	case "uint8":
		return tensor.Uint8, 0, nil
	}
	return tensor.Dtype{}, 0, fmt.Errorf("unknown dtype %q", s)
}

func (c *fixtureCase) reduceOp() (comm.ReduceOp, error) {
	if c.ReduceOp == nil {
		return comm.ReduceOp{}, fmt.Errorf("op %s needs reduce_op, the case has none", c.Op)
	}
	switch *c.ReduceOp {
	case "sum":
		return comm.Sum, nil
	case "avg":
		return comm.Avg, nil
	case "product":
		return comm.Product, nil
	case "min":
		return comm.Min, nil
	case "max":
		return comm.Max, nil
	case "band":
		return comm.BAnd, nil
	case "bor":
		return comm.BOr, nil
	case "bxor":
		return comm.BXor, nil
	case "premul_sum":
		if c.Factor == nil {
			return comm.ReduceOp{}, errors.New("premul_sum without factor")
		}
		return comm.PremulSum(*c.Factor), nil
	}
	return comm.ReduceOp{}, fmt.Errorf("unknown reduce_op %q", *c.ReduceOp)
}

func root(p *int, what, op string) (int, error) {
	if p == nil {
		return 0, fmt.Errorf("op %s needs %s, the case has none", op, what)
	}
	return *p, nil
}

// apply builds the case's collective on rank r's inputs.
func (c *fixtureCase) apply(pg *comm.ProcessGroup, r int, ins G.Nodes) (G.Nodes, error) {
	one := func(n *G.Node, err error) (G.Nodes, error) {
		if err != nil {
			return nil, err
		}
		return G.Nodes{n}, nil
	}
	first := func() (*G.Node, error) {
		if len(ins) != 1 {
			return nil, fmt.Errorf("op %s takes one input, rank %d has %d", c.Op, r, len(ins))
		}
		return ins[0], nil
	}
	switch c.Op {
	case "broadcast":
		x, err := first()
		if err != nil {
			return nil, err
		}
		src, err := root(c.Src, "src", c.Op)
		if err != nil {
			return nil, err
		}
		return one(Broadcast(pg, x, src))
	case "all_reduce", "reduce", "reduce_scatter_tensor":
		x, err := first()
		if err != nil {
			return nil, err
		}
		red, err := c.reduceOp()
		if err != nil {
			return nil, err
		}
		switch c.Op {
		case "all_reduce":
			return one(AllReduce(pg, x, red))
		case "reduce_scatter_tensor":
			return one(ReduceScatterTensor(pg, x, red))
		}
		dst, err := root(c.Dst, "dst", c.Op)
		if err != nil {
			return nil, err
		}
		return one(Reduce(pg, x, dst, red))
	case "all_gather":
		x, err := first()
		if err != nil {
			return nil, err
		}
		return AllGather(pg, x)
	case "all_gather_into_tensor":
		x, err := first()
		if err != nil {
			return nil, err
		}
		return one(AllGatherIntoTensor(pg, x))
	case "gather":
		x, err := first()
		if err != nil {
			return nil, err
		}
		dst, err := root(c.Dst, "dst", c.Op)
		if err != nil {
			return nil, err
		}
		return Gather(pg, x, dst)
	case "scatter":
		src, err := root(c.Src, "src", c.Op)
		if err != nil {
			return nil, err
		}
		return one(Scatter(pg, ins, src))
	case "reduce_scatter":
		red, err := c.reduceOp()
		if err != nil {
			return nil, err
		}
		return one(ReduceScatter(pg, ins, red))
	case "all_to_all":
		return AllToAll(pg, ins)
	case "all_to_all_single":
		x, err := first()
		if err != nil {
			return nil, err
		}
		if c.InputSplitSizes == nil {
			return one(AllToAllSingle(pg, x, nil, nil))
		}
		if len(c.InputSplitSizes) != c.World {
			return nil, fmt.Errorf("input_split_sizes has %d rows for world %d", len(c.InputSplitSizes), c.World)
		}
		out := make([]int, c.World)
		for j, row := range c.InputSplitSizes {
			if len(row) != c.World {
				return nil, fmt.Errorf("input_split_sizes[%d] has %d entries for world %d", j, len(row), c.World)
			}
			out[j] = row[r]
		}
		return one(AllToAllSingle(pg, x, out, c.InputSplitSizes[r]))
	}
	return nil, fmt.Errorf("unknown op %q", c.Op)
}

// dense makes a tensor of dtype dt from a fixture tensor.
func (ft fixtureTensor) dense(dt tensor.Dtype) (*tensor.Dense, error) {
	size := 1
	for _, s := range ft.Shape {
		size *= s
	}
	if len(ft.Data) != size {
		return nil, fmt.Errorf("shape %v needs %d values, the file gives %d", ft.Shape, size, len(ft.Data))
	}
	buf := newFlat(dt, size)
	for i, num := range ft.Data {
		if isFloat(dt) {
			f, err := num.Float64()
			if err != nil {
				return nil, err
			}
			switch b := buf.(type) {
			case []float64:
				b[i] = f
			case []float32:
				b[i] = float32(f)
			}
			continue
		}
		v, err := strconv.ParseInt(num.String(), 10, 64)
		if err != nil {
			return nil, err
		}
		switch b := buf.(type) {
		case []int64:
			b[i] = v
		case []int32:
			b[i] = int32(v)
		case []int8:
			b[i] = int8(v)
		case []uint8:
			b[i] = uint8(v)
		}
	}
	if len(ft.Shape) == 0 {
		return tensor.New(tensor.WithShape(), tensor.WithBacking(buf)), nil
	}
	return tensor.New(tensor.WithShape(ft.Shape...), tensor.WithBacking(buf)), nil
}

// equalValues compares a value with a fixture tensor: exactly for integers,
// within tol*max(1,|want|) for floats.
func equalValues(got G.Value, want fixtureTensor, dt tensor.Dtype, tol float64) error {
	wt, err := want.dense(dt)
	if err != nil {
		return err
	}
	if gs, ws := got.Shape(), wt.Shape(); !gs.Eq(ws) {
		return fmt.Errorf("shape %v, want %v", gs, ws)
	}
	if isFloat(dt) {
		g, err := flatFloats(got)
		if err != nil {
			return err
		}
		w, _ := flatFloats(wt)
		return closeTo(g, w, tol)
	}
	g, _, err := flatOf(got)
	if err != nil {
		return err
	}
	w, _, _ := flatOf(wt)
	if gs, ws := fmt.Sprint(g), fmt.Sprint(w); gs != ws {
		return fmt.Errorf("got %s, want %s", gs, ws)
	}
	return nil
}

// TestFixtures runs every golden case with its world of goroutine ranks on
// the local backend (under the dataflow executor and under TapeMachine) and
// the first case of each op on the TCP backend, and checks every rank's
// outputs and input gradients.
func TestFixtures(t *testing.T) {
	cases := loadFixtures(t)
	seenTCP := map[string]bool{}
	for _, c := range cases {
		runs := []struct {
			be backend
			ex executor
		}{{localBackend, dataflow}, {localBackend, tape}}
		if !seenTCP[c.Op] {
			seenTCP[c.Op] = true
			runs = append(runs, struct {
				be backend
				ex executor
			}{tcpBackend, dataflow})
		}
		for _, run := range runs {
			t.Run(c.Name+"/"+run.be.name+"/"+run.ex.name, func(t *testing.T) {
				runFixture(t, c, run.be, run.ex)
			})
		}
	}
}

func runFixture(t *testing.T, c fixtureCase, be backend, ex executor) {
	dt, tol, err := fixtureDtype(c.Dtype)
	if err != nil {
		t.Fatal(err)
	}
	if c.World < 1 || len(c.Inputs) != c.World || len(c.Outputs) != c.World {
		t.Fatalf("case %s: world %d with inputs for %d ranks and outputs for %d", c.Name, c.World, len(c.Inputs), len(c.Outputs))
	}
	differentiable := isFloat(dt)
	if differentiable && (len(c.GradOutputs) != c.World || len(c.InputGrads) != c.World) {
		t.Fatalf("case %s: float case without grad_outputs and input_grads for every rank", c.Name)
	}
	ctx := ctxFor(t, time.Minute)
	pgs := be.groups(t, ctx, c.World)
	// Graphs are built one rank at a time (see the package documentation on
	// goroutine ranks), then run together.
	runs := make([]func() error, c.World)
	for r, pg := range pgs {
		if runs[r], err = fixtureRank(ctx, c, r, pg, dt, tol, ex); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error { return runs[r]() })
}

// fixtureRank builds rank r's graph of the case and returns the function
// that runs and checks it.
func fixtureRank(ctx context.Context, c fixtureCase, r int, pg *comm.ProcessGroup, dt tensor.Dtype, tol float64, ex executor) (func() error, error) {
	g := G.NewGraph()
	var ins G.Nodes
	for k, ft := range c.Inputs[r] {
		v, err := ft.dense(dt)
		if err != nil {
			return nil, fmt.Errorf("inputs[%d][%d]: %w", r, k, err)
		}
		ins = append(ins, input(g, fmt.Sprintf("in%d", k), v))
	}
	templates := false
	if c.Op == "scatter" && len(ins) == 0 {
		// Off the root the file gives no inputs; this API, like PyTorch's,
		// takes one node per rank everywhere for the output's shape.
		if len(c.Outputs[r]) != 1 {
			return nil, fmt.Errorf("scatter output of rank %d: %d tensors", r, len(c.Outputs[r]))
		}
		templates = true
		for k := 0; k < c.World; k++ {
			ins = append(ins, input(g, fmt.Sprintf("template%d", k), tensor.New(tensor.Of(dt), tensor.WithShape(c.Outputs[r][0].Shape...))))
		}
	}
	outs, err := c.apply(pg, r, ins)
	if err != nil {
		return nil, fmt.Errorf("building %s: %w", c.Op, err)
	}
	if len(outs) != len(c.Outputs[r]) {
		return nil, fmt.Errorf("%s gave %d outputs, the case has %d", c.Op, len(outs), len(c.Outputs[r]))
	}

	if !isFloat(dt) {
		return intFixtureRank(ctx, c, r, pg, g, ins, outs, dt, ex)
	}

	if len(c.GradOutputs[r]) != len(outs) || (!templates && len(c.InputGrads[r]) != len(ins)) {
		return nil, fmt.Errorf("grad_outputs (%d) or input_grads (%d) do not match outputs (%d) and inputs (%d)",
			len(c.GradOutputs[r]), len(c.InputGrads[r]), len(outs), len(ins))
	}
	gs := make(G.Nodes, len(outs))
	for k, ft := range c.GradOutputs[r] {
		v, err := ft.dense(dt)
		if err != nil {
			return nil, fmt.Errorf("grad_outputs[%d][%d]: %w", r, k, err)
		}
		gs[k] = input(g, fmt.Sprintf("gy%d", k), v)
	}
	cost, err := objective(outs, gs)
	if err != nil {
		return nil, fmt.Errorf("objective: %w", err)
	}
	grads, err := G.Grad(cost, ins...)
	if err != nil {
		return nil, fmt.Errorf("differentiating: %w", err)
	}
	return func() error { return checkFixtureRank(ctx, c, r, g, ins, outs, grads, templates, dt, tol, ex) }, nil
}

// checkFixtureRank runs rank r's graph and checks its outputs and gradients.
func checkFixtureRank(ctx context.Context, c fixtureCase, r int, g *G.ExprGraph, ins, outs, grads G.Nodes, templates bool, dt tensor.Dtype, tol float64, ex executor) error {
	gv, err := ex.run(ctx, g, ins, grads)
	if err != nil {
		return fmt.Errorf("running: %w", err)
	}
	for k, o := range outs {
		if err := equalValues(o.Value(), c.Outputs[r][k], dt, tol); err != nil {
			return fmt.Errorf("output %d: %w", k, err)
		}
	}
	for k, v := range gv {
		if templates {
			vals, err := flatFloats(v)
			if err != nil {
				return err
			}
			if err := closeTo(vals, make([]float64, len(vals)), 0); err != nil {
				return fmt.Errorf("gradient of shape template %d off the root: %w", k, err)
			}
			continue
		}
		if err := equalValues(v, c.InputGrads[r][k], dt, tol); err != nil {
			return fmt.Errorf("gradient of input %d: %w", k, err)
		}
	}
	return nil
}

// intFixtureRank checks that asking for a gradient of an integer case is
// refused with an error naming the op and the reduce op, and returns the
// function that runs the case forward and checks its outputs.
func intFixtureRank(ctx context.Context, c fixtureCase, r int, pg *comm.ProcessGroup, g *G.ExprGraph, ins, outs G.Nodes, dt tensor.Dtype, ex executor) (func() error, error) {
	probe := G.NewGraph() // the same collective in a graph of its own, to differentiate
	pins := make(G.Nodes, len(ins))
	for k, n := range ins {
		pins[k] = input(probe, n.Name(), tensor.New(tensor.Of(dt), tensor.WithShape(n.Shape().Clone()...)))
	}
	pouts, err := c.apply(pg, r, pins)
	if err != nil {
		return nil, err
	}
	gs := make(G.Nodes, len(pouts))
	for k, o := range pouts {
		gs[k] = input(probe, fmt.Sprintf("gy%d", k), tensor.New(tensor.Of(dt), tensor.WithShape(o.Shape().Clone()...)))
	}
	_, err = G.Backpropagate(pouts, gs, pins)
	if err == nil {
		return nil, fmt.Errorf("differentiating %s of %v tensors succeeded; it must be refused", c.Op, dt)
	}
	want := []string{c.Op, "no gradient"}
	if c.ReduceOp != nil {
		want = append(want, *c.ReduceOp)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			return nil, fmt.Errorf("refusal %q does not mention %q", err, w)
		}
	}
	return func() error {
		if _, err := ex.run(ctx, g, nil, nil); err != nil {
			return fmt.Errorf("running: %w", err)
		}
		for k, o := range outs {
			if err := equalValues(o.Value(), c.Outputs[r][k], dt, 0); err != nil {
				return fmt.Errorf("output %d: %w", k, err)
			}
		}
		return nil
	}, nil
}
