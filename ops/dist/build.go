package dist

import (
	"fmt"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// spec is what a caller chooses about a collective node; build works out the
// rest (shapes, types, sequence number) and checks it all.
type spec struct {
	kind      kind
	red       comm.ReduceOp
	root      int
	inSplits  []int
	outSplits []int
	scale     float64 // 0 means 1
	list      bool
}

// build checks the call and adds the collective node to the inputs' graph.
func build(pg *comm.ProcessGroup, s spec, data ...*G.Node) (*G.Node, error) {
	name := s.kind.String()
	fail := func(format string, args ...any) (*G.Node, error) {
		return nil, fmt.Errorf("dist: %s: %s: %w", name, fmt.Sprintf(format, args...), ErrInvalidArgument)
	}
	if pg == nil {
		return fail("nil process group")
	}
	if !pg.IsMember() {
		return nil, fmt.Errorf("dist: %s on group %q: %w", name, pg.Name(), comm.ErrNotMember)
	}
	if len(data) == 0 {
		return fail("no input nodes")
	}
	for i, d := range data {
		if d == nil {
			return fail("input %d is a nil node", i)
		}
		if d.Graph() == nil || d.Graph() != data[0].Graph() {
			return fail("input %d (%q) is not in the graph of input 0 (%q)", i, d.Name(), data[0].Name())
		}
		if d.Shape().TotalSize() == 0 {
			return fail("input %d (%q) of shape %v has no elements; gorgonia cannot hold empty tensors", i, d.Name(), d.Shape())
		}
		if d.Dtype() != data[0].Dtype() {
			return fail("input %d (%q) has dtype %v, input 0 has %v; all inputs need one dtype", i, d.Name(), d.Dtype(), data[0].Dtype())
		}
	}
	dt := data[0].Dtype()
	if !supported(dt) {
		return fail("dtype %v is not supported; use float32, float64, int8, uint8, int32 or int64", dt)
	}
	w := pg.Size()
	op := &collective{kind: s.kind, pg: pg, red: s.red, root: s.root, scale: s.scale, list: s.list, nData: len(data), dt: dt}
	if op.scale == 0 {
		op.scale = 1
	}
	if op.scale != 1 && !isFloat(dt) {
		return fail("scaling needs a float dtype, got %v", dt)
	}
	if s.kind.reduces() {
		if err := checkReduceOp(s.red, dt); err != nil {
			return fail("%v", err)
		}
	} else {
		op.red = comm.ReduceOp{}
	}
	if s.kind.rooted() {
		if s.root < 0 || s.root >= w {
			return fail("root %d is out of range for a group of %d ranks", s.root, w)
		}
	} else {
		op.root = 0
	}
	if err := op.shapes(w, data, s); err != nil {
		return fail("%v", err)
	}
	if op.outShape.TotalSize() == 0 {
		return fail("the output (shape %v) would have no elements; gorgonia cannot hold empty tensors", op.outShape)
	}

	g := data[0].Graph()
	prev, seq := chain(g, pg, data)
	op.seq = seq
	children := append([]*G.Node(nil), data...)
	if prev != nil {
		children = append(children, prev)
		op.ordered = true
	}
	op.inTypes = make([]hm.Type, len(children))
	for i, c := range children {
		op.inTypes[i] = c.Type()
	}
	if len(op.outShape) == 0 {
		op.outType = dt
	} else {
		op.outType = G.TensorType{Dims: len(op.outShape), Of: dt}
	}
	n, err := G.ApplyOp(op, children...)
	if err != nil {
		return nil, fmt.Errorf("dist: %s: adding the node to the graph: %v: %w", name, err, ErrInvalidArgument)
	}
	return n, nil
}

// checkReduceOp refuses reduce ops that cannot apply to dtype dt.
func checkReduceOp(red comm.ReduceOp, dt tensor.Dtype) error {
	switch red.Kind() {
	case comm.KindSum, comm.KindAvg, comm.KindProduct, comm.KindMin, comm.KindMax:
		return nil
	case comm.KindBAnd, comm.KindBOr, comm.KindBXor:
		if isFloat(dt) {
			return fmt.Errorf("reduce op %v is bitwise and takes integer tensors only, got %v", red, dt)
		}
		return nil
	case comm.KindPremulSum:
		if f := red.Factor(); !isFloat(dt) && f != math.Trunc(f) {
			return fmt.Errorf("reduce op %v on integer tensors needs a whole factor", red)
		}
		return nil
	}
	return fmt.Errorf("invalid reduce op %v (the zero ReduceOp); use comm.Sum, comm.Avg, comm.Max or another of comm's ReduceOps", red)
}

// shapes works out op.block and op.outShape (and the splits) from the inputs.
func (op *collective) shapes(w int, data []*G.Node, s spec) error {
	want := func(k int) error {
		if len(data) != k {
			return fmt.Errorf("got %d input nodes, want %d", len(data), k)
		}
		return nil
	}
	x := data[0].Shape().Clone()
	stacked := func(b tensor.Shape) tensor.Shape { return append(tensor.Shape{w}, b...) }
	switch op.kind {
	case kindAllReduce, kindBroadcast, kindReduce:
		if err := want(1); err != nil {
			return err
		}
		op.block, op.outShape = x, x.Clone()
	case kindAllGather, kindGather:
		if err := want(1); err != nil {
			return err
		}
		op.block, op.outShape = x, stacked(x)
	case kindAllGatherIntoTensor:
		if err := want(1); err != nil {
			return err
		}
		op.block = x
		if len(x) == 0 {
			op.outShape = tensor.Shape{w}
		} else {
			op.outShape = append(tensor.Shape{w * x[0]}, x[1:]...)
		}
	case kindScatter, kindReduceScatter, kindAllToAll:
		b, err := perRankBlock(w, data, op.list)
		if err != nil {
			return err
		}
		op.block = b
		if op.kind == kindAllToAll {
			op.outShape = stacked(b)
		} else {
			op.outShape = b.Clone()
		}
	case kindReduceScatterTensor:
		if err := want(1); err != nil {
			return err
		}
		if len(x) == 0 || x[0]%w != 0 {
			return fmt.Errorf("input of shape %v cannot be cut into %d equal blocks along dimension 0", x, w)
		}
		op.block = append(tensor.Shape{x[0] / w}, x[1:]...)
		op.outShape = op.block.Clone()
	case kindAllToAllSingle:
		if err := want(1); err != nil {
			return err
		}
		if len(x) == 0 {
			return fmt.Errorf("input is a scalar; all_to_all_single splits dimension 0")
		}
		in, err := splits(s.inSplits, x[0], w, "input")
		if err != nil {
			return err
		}
		out, err := splits(s.outSplits, x[0], w, "output")
		if err != nil {
			return err
		}
		if r := op.pg.Rank(); in[r] != out[r] {
			return fmt.Errorf("this rank (%d) sends itself %d rows but expects %d from itself; inSplits[%d] must equal outSplits[%d]", r, in[r], out[r], r, r)
		}
		rows := 0
		for _, v := range out {
			rows += v
		}
		op.inSplits, op.outSplits = in, out
		op.block = x
		op.outShape = append(tensor.Shape{rows}, x[1:]...)
	case kindAllReduceGrad, kindReduceGrad:
		if err := want(2); err != nil {
			return err
		}
		if !x.Eq(data[1].Shape()) {
			return fmt.Errorf("input shape %v and gradient shape %v differ", x, data[1].Shape())
		}
		op.block, op.outShape = x, x.Clone()
	case kindReduceScatterGrad:
		g := data[len(data)-1].Shape().Clone()
		ins := data[:len(data)-1]
		if op.list {
			b, err := perRankBlock(w, ins, true)
			if err != nil {
				return err
			}
			if !b.Eq(g) {
				return fmt.Errorf("input blocks of shape %v and gradient of shape %v differ", b, g)
			}
			op.outShape = stacked(g)
		} else {
			if len(ins) != 1 || ins[0].Shape().TotalSize() != w*g.TotalSize() {
				return fmt.Errorf("packed input must hold %d blocks of the gradient's shape %v", w, g)
			}
			op.outShape = ins[0].Shape().Clone()
		}
		op.block = g
	default:
		return fmt.Errorf("unknown collective kind %d", op.kind)
	}
	return nil
}

// perRankBlock returns the shape of one rank's block of a per-rank input:
// list holds one node per rank, all of one shape; otherwise the one node is
// stacked, of shape [w, block...].
func perRankBlock(w int, data []*G.Node, list bool) (tensor.Shape, error) {
	if list {
		if len(data) != w {
			return nil, fmt.Errorf("got %d input nodes, want one per rank (%d)", len(data), w)
		}
		b := data[0].Shape()
		for i, d := range data {
			if !d.Shape().Eq(b) {
				return nil, fmt.Errorf("input %d has shape %v, input 0 has %v; all need one shape", i, d.Shape(), b)
			}
		}
		return b.Clone(), nil
	}
	if len(data) != 1 {
		return nil, fmt.Errorf("got %d packed input nodes, want 1", len(data))
	}
	s := data[0].Shape()
	if len(s) == 0 || s[0] != w {
		return nil, fmt.Errorf("packed input of shape %v does not stack %d blocks", s, w)
	}
	return s[1:].Clone(), nil
}

// splits checks (or, when nil, makes equal) split sizes of rows rows over w ranks.
func splits(sp []int, rows, w int, what string) ([]int, error) {
	if sp == nil {
		if rows%w != 0 {
			return nil, fmt.Errorf("no %s splits given and %d rows do not divide into %d equal parts", what, rows, w)
		}
		sp = make([]int, w)
		for i := range sp {
			sp[i] = rows / w
		}
		return sp, nil
	}
	if len(sp) != w {
		return nil, fmt.Errorf("%d %s splits for a group of %d ranks", len(sp), what, w)
	}
	sum := 0
	for j, v := range sp {
		if v < 0 {
			return nil, fmt.Errorf("%s split %d is negative (%d)", what, j, v)
		}
		sum += v
	}
	if what == "input" && sum != rows {
		return nil, fmt.Errorf("input splits %v add up to %d rows, the input has %d", sp, sum, rows)
	}
	return append([]int(nil), sp...), nil
}
