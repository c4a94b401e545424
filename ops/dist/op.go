package dist

import (
	"context"
	"fmt"
	"hash"
	"strings"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/opkit"
)

// kind names what a collective node computes.
type kind uint8

const (
	kindAllReduce kind = iota + 1
	kindBroadcast
	kindReduce
	kindAllGather           // one input, output stacked [world, shape...]
	kindAllGatherIntoTensor // one input, output concatenated along dimension 0
	kindGather              // one input, output stacked (zeros off the root)
	kindScatter             // per-rank inputs (list or packed), one output
	kindReduceScatter       // per-rank inputs (list or packed), one output
	kindReduceScatterTensor // one concatenated input, one output
	kindAllToAll            // per-rank inputs (list or packed), output stacked
	kindAllToAllSingle      // rows split by inSplits, gathered by outSplits

	// Backward kinds of the reductions that are not linear (product, min,
	// max): each is one node that issues two collectives back to back.
	kindAllReduceGrad     // inputs x, g: all-gather x, all-reduce g
	kindReduceGrad        // inputs x, g: all-gather x, broadcast g from the root
	kindReduceScatterGrad // inputs (list or packed) and g: two all-to-alls
)

var kindNames = map[kind]string{
	kindAllReduce:           "all_reduce",
	kindBroadcast:           "broadcast",
	kindReduce:              "reduce",
	kindAllGather:           "all_gather",
	kindAllGatherIntoTensor: "all_gather_into_tensor",
	kindGather:              "gather",
	kindScatter:             "scatter",
	kindReduceScatter:       "reduce_scatter",
	kindReduceScatterTensor: "reduce_scatter_tensor",
	kindAllToAll:            "all_to_all",
	kindAllToAllSingle:      "all_to_all_single",
	kindAllReduceGrad:       "all_reduce_backward",
	kindReduceGrad:          "reduce_backward",
	kindReduceScatterGrad:   "reduce_scatter_backward",
}

func (k kind) String() string { return kindNames[k] }

// reduces reports whether the kind combines values with a ReduceOp.
func (k kind) reduces() bool {
	switch k {
	case kindAllReduce, kindReduce, kindReduceScatter, kindReduceScatterTensor,
		kindAllReduceGrad, kindReduceGrad, kindReduceScatterGrad:
		return true
	}
	return false
}

// rooted reports whether the kind has a root (src or dst).
func (k kind) rooted() bool {
	switch k {
	case kindBroadcast, kindReduce, kindGather, kindScatter, kindReduceGrad:
		return true
	}
	return false
}

// collective is the gorgonia op behind every node this package builds. It is
// bound to one process group and carries a sequence number unique among the
// collectives of that group in its graph (see order.go), which is part of its
// hash: gorgonia merges nodes whose ops hash alike, and two collectives on the
// same input are two different communications.
type collective struct {
	opkit.Plain // computes in Go into memory of its own

	kind kind
	pg   *comm.ProcessGroup
	seq  int

	red       comm.ReduceOp // for reducing kinds
	root      int           // for rooted kinds
	inSplits  []int         // kindAllToAllSingle
	outSplits []int         // kindAllToAllSingle
	scale     float64       // the output is multiplied by scale (1 but in backward nodes)

	list    bool // the per-rank input is world separate nodes, not one packed node
	nData   int  // children that carry data (the ordering token, if any, follows)
	ordered bool // the last child is the previous collective of the group: an ordering edge

	dt       tensor.Dtype
	block    tensor.Shape // shape of one rank's block (the input of one-input kinds)
	outShape tensor.Shape
	inTypes  []hm.Type // every child's type, ordering token included
	outType  hm.Type
}

var (
	_ G.Op         = (*collective)(nil)
	_ G.SDOp       = (*collective)(nil)
	_ fmt.Stringer = (*collective)(nil)
)

// Arity is the number of children: the data inputs plus the ordering edge.
func (op *collective) Arity() int { return len(op.inTypes) }

// Type is the op's concrete function type, from the children's types to the
// output's. A fresh value each call: gorgonia recycles function types.
func (op *collective) Type() hm.Type {
	ts := make([]hm.Type, 0, len(op.inTypes)+1)
	ts = append(ts, op.inTypes...)
	ts = append(ts, op.outType)
	return hm.NewFnType(ts...)
}

// InferShape returns the output shape worked out when the node was built.
func (op *collective) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return op.outShape.Clone(), nil
}

// WriteHash writes everything that makes this collective what it is,
// including its group and sequence number.
func (op *collective) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "tandem/dist.%s|pg=%p:%s|seq=%d|red=%v|root=%d|in=%v|out=%v|scale=%v|list=%t|data=%d|ord=%t|%v|%v|%v",
		op.kind, op.pg, op.pg.Name(), op.seq, op.red, op.root, op.inSplits, op.outSplits, op.scale,
		op.list, op.nData, op.ordered, op.dt, op.block, op.outShape)
}

// Hashcode is the FNV-1a hash of WriteHash.
func (op *collective) Hashcode() uint32 { return opkit.Hash(op) }

// String names the op as errors and graph dumps show it, for example
// "all_reduce(sum)#3@world" or "broadcast(src=1)#0@tp".
func (op *collective) String() string {
	var b strings.Builder
	b.WriteString(op.kind.String())
	var args []string
	if op.kind.reduces() {
		args = append(args, op.red.String())
	}
	if op.kind.rooted() {
		name := "dst"
		if op.kind == kindBroadcast || op.kind == kindScatter {
			name = "src"
		}
		args = append(args, fmt.Sprintf("%s=%d", name, op.root))
	}
	if op.kind == kindAllToAllSingle {
		args = append(args, fmt.Sprintf("out=%v", op.outSplits), fmt.Sprintf("in=%v", op.inSplits))
	}
	if op.scale != 1 {
		args = append(args, fmt.Sprintf("scale=%v", op.scale))
	}
	if len(args) > 0 {
		b.WriteString("(" + strings.Join(args, ",") + ")")
	}
	fmt.Fprintf(&b, "#%d@%s", op.seq, op.pg.Name())
	return b.String()
}

// DiffWRT says the data inputs are differentiable and the ordering edge is
// not. Ops that cannot be differentiated (bitwise reductions, integer
// tensors) still say true, so that asking for their gradient reaches SymDiff,
// which explains why not.
func (op *collective) DiffWRT(n int) []bool {
	d := make([]bool, n)
	for i := range d {
		d[i] = i < op.nData
	}
	return d
}

// Do runs the collective without a context (gorgonia's TapeMachine): it is
// bounded by the group's default timeout.
func (op *collective) Do(inputs ...G.Value) (G.Value, error) {
	return op.DoContext(context.Background(), nil, inputs...)
}
