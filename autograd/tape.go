package autograd

import (
	"context"
	"fmt"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// The graph on one worker is a tape of nodes linked by tensor identity: a
// tensor produced by a node (a local function's output, a received tensor,
// a leaf marked with RequireGrad) is tracked, and every later node that
// reads the same *tensor.Dense (a local function, or an RPC that sends it)
// consumes it. Backward walks the tape in reverse, summing the gradient
// contributions of every consumer of a tensor before passing it on.

type nodeKind uint8

const (
	kindFunc nodeKind = iota + 1 // a local differentiable function
	kindRecv                     // tensors received in one RPC message
	kindSend                     // tensors sent in one RPC message
	kindLeaf                     // a tensor whose gradient is kept (RequireGrad)
)

// tinfo is a tracked tensor.
type tinfo struct {
	t         *tensor.Dense
	producer  *node
	consumers int // edges from consumer nodes (function inputs, send entries)
}

// node is one recorded piece of the graph.
type node struct {
	kind    nodeKind
	name    string
	inputs  []*tinfo // kindFunc: parallel to the function's inputs (nil: not tracked); kindSend: the tracked tensors sent
	outputs []*tinfo // kindFunc, kindRecv, kindLeaf
	nIn     int      // kindFunc: number of inputs (gradients returned)

	backward BackwardFunc // kindFunc
	peer     int          // kindRecv: the sender; kindSend: the receiver
	msg      uint64       // kindRecv: the sender's send id; kindSend: this send's id
}

// BackwardFunc computes a recorded function's vector-Jacobian product: given
// the gradients of the loss with respect to the function's outputs (one per
// output, each of its output's shape and dtype), it returns the gradients
// with respect to its inputs, one per input (nil for an input that needs
// none). Gradients of parameters the function read are not returned: the
// function adds them to the context with AccumulateGrad. It runs once per
// backward pass, possibly concurrently with other functions' backward.
type BackwardFunc func(ctx context.Context, gradOutputs []*tensor.Dense) (gradInputs []*tensor.Dense, err error)

// Record adds a local differentiable function to the context's graph on
// this worker: it read inputs and produced outputs (new tensors, not seen by
// the context before), and backward computes its vector-Jacobian product.
// Inputs the context tracks (outputs of earlier functions, tensors received
// through RPCs, leaves marked with RequireGrad) link it into the graph;
// other inputs are constants. The outputs become tracked, so that sending
// them through an RPC or passing them to another function extends the
// graph. Tensors are linked by identity: a copy or a view of a tracked
// tensor is a new, untracked tensor. Inputs must not change between the
// forward and the backward pass.
//
// Function.Apply records for you; use Record for computations that are not
// gorgonia graphs.
func (c *Context) Record(name string, inputs, outputs []*tensor.Dense, backward BackwardFunc) error {
	if backward == nil {
		return fmt.Errorf("%w: autograd: Record(%q) with a nil backward function", ErrInvalidArgument, name)
	}
	if len(outputs) == 0 {
		return fmt.Errorf("%w: autograd: Record(%q) with no outputs: nothing could carry a gradient to it", ErrInvalidArgument, name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return fmt.Errorf("%w: autograd: Record(%q) in %s, which has ended", ErrClosed, name, c.id)
	}
	seen := map[*tensor.Dense]bool{}
	for i, t := range outputs {
		if t == nil {
			return fmt.Errorf("%w: autograd: Record(%q): output %d is nil", ErrInvalidArgument, name, i)
		}
		if c.tensors[t] != nil || seen[t] {
			return fmt.Errorf("%w: autograd: Record(%q): output %d is already tracked; a function must return new tensors (in-place updates of tracked tensors are not supported)", ErrInvalidArgument, name, i)
		}
		seen[t] = true
	}
	n := &node{kind: kindFunc, name: name, backward: backward, nIn: len(inputs), inputs: make([]*tinfo, len(inputs))}
	for i, t := range inputs {
		if t == nil {
			return fmt.Errorf("%w: autograd: Record(%q): input %d is nil", ErrInvalidArgument, name, i)
		}
		if seen[t] {
			return fmt.Errorf("%w: autograd: Record(%q): input %d is also an output", ErrInvalidArgument, name, i)
		}
		if ti := c.tensors[t]; ti != nil {
			n.inputs[i] = ti
		}
	}
	for _, ti := range n.inputs {
		if ti != nil {
			ti.consumers++
		}
	}
	c.addOutputsLocked(n, outputs)
	c.nodes = append(c.nodes, n)
	return nil
}

func (c *Context) addOutputsLocked(n *node, outputs []*tensor.Dense) {
	n.outputs = make([]*tinfo, len(outputs))
	for i, t := range outputs {
		ti := &tinfo{t: t, producer: n}
		n.outputs[i] = ti
		c.tensors[t] = ti
	}
}

// Tracked reports whether the context tracks t on this worker: a gradient
// for it will be computed by Backward.
func (c *Context) Tracked(t *tensor.Dense) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tensors[t] != nil
}

// RequireGrad makes t, a tensor no function produced (an input batch, say),
// a tracked leaf: functions and RPCs that read it get a gradient path to
// it, and after Backward its gradient is available from Grad. Calling it on
// a tensor already tracked does nothing.
func (c *Context) RequireGrad(t *tensor.Dense) error {
	if t == nil {
		return fmt.Errorf("%w: autograd: RequireGrad(nil)", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return fmt.Errorf("%w: autograd: RequireGrad in %s, which has ended", ErrClosed, c.id)
	}
	if c.tensors[t] != nil {
		return nil
	}
	n := &node{kind: kindLeaf, name: "leaf"}
	c.addOutputsLocked(n, []*tensor.Dense{t})
	c.nodes = append(c.nodes, n)
	return nil
}

// Grad returns a copy of the gradient accumulated for a RequireGrad leaf on
// this worker (nil if it has none yet).
func (c *Context) Grad(t *tensor.Dense) *tensor.Dense {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.leaf[t]; g != nil {
		return g.Clone().(*tensor.Dense)
	}
	return nil
}

// AccumulateGrad adds g to the gradient of p accumulated in this context on
// this worker (not to p.Grad, so that concurrent contexts do not mix).
// Backward functions call it for the parameters they read.
func (c *Context) AccumulateGrad(p *models.Param, g *tensor.Dense) error {
	if p == nil || p.Value == nil || g == nil {
		return fmt.Errorf("%w: autograd: AccumulateGrad needs a parameter with a value and a gradient", ErrInvalidArgument)
	}
	if g.Dtype() != p.Value.Dtype() || g.Shape().TotalSize() != p.Value.Shape().TotalSize() {
		return fmt.Errorf("%w: autograd: gradient of %q is %v %v but the parameter is %v %v", ErrInvalidArgument, p.Name, g.Dtype(), g.Shape(), p.Value.Dtype(), p.Value.Shape())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return fmt.Errorf("%w: autograd: gradient of %q arrived after %s ended", ErrClosed, p.Name, c.id)
	}
	cur := c.grads[p]
	if cur == nil {
		c.grads[p] = reshapedCopy(g, p.Value.Shape())
		return nil
	}
	return addInto(cur, g)
}

// Gradients returns copies of the parameter gradients accumulated on this
// worker in the context.
func (c *Context) Gradients() map[*models.Param]*tensor.Dense {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[*models.Param]*tensor.Dense, len(c.grads))
	for p, g := range c.grads {
		out[p] = g.Clone().(*tensor.Dense)
	}
	return out
}

// gradOf returns the context's gradient of p itself (nil if none), for the
// optimizer's step on this worker.
func (c *Context) gradOf(p *models.Param) *tensor.Dense {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grads[p]
}

// recordSend records the send function of an outgoing message carrying ts.
// It returns the mask of tracked tensors ("" when none is tracked, and
// then no send function is recorded) and the send's id.
func (c *Context) recordSend(to int, ts []*tensor.Dense) (mask string, id uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return "", 0, fmt.Errorf("%w: autograd: an RPC made in %s after it ended", ErrClosed, c.id)
	}
	c.peers[to] = true
	c.known[to] = true
	var ins []*tinfo
	var b strings.Builder
	for _, t := range ts {
		if ti := c.tensors[t]; ti != nil {
			ins = append(ins, ti)
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	if len(ins) == 0 {
		return "", 0, nil
	}
	id = c.m.newMsgID()
	n := &node{kind: kindSend, name: "send to worker " + fmt.Sprint(to), inputs: ins, peer: to, msg: id}
	for _, ti := range ins {
		ti.consumers++
	}
	c.nodes = append(c.nodes, n)
	c.sends[id] = n
	return b.String(), id, nil
}

// recordRecv records the receive function of an incoming message: the
// tensors of ts marked in mask become tracked, their gradients going back
// to send function msg on worker from.
func (c *Context) recordRecv(from int, msg uint64, mask string, ts []*tensor.Dense) error {
	if len(mask) != len(ts) {
		return fmt.Errorf("%w: autograd: a message of %s from worker %d marks %d tensors but carries %d (do both sides use the same Go types?)", ErrInvalidArgument, c.id, from, len(mask), len(ts))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return fmt.Errorf("%w: autograd: a message of %s arrived after it ended", ErrClosed, c.id)
	}
	c.peers[from] = true
	c.known[from] = true
	var outs []*tensor.Dense
	for i, t := range ts {
		switch mask[i] {
		case '1':
			if c.tensors[t] != nil {
				return fmt.Errorf("%w: autograd: a received tensor is already tracked in %s", ErrInvalidArgument, c.id)
			}
			outs = append(outs, t)
		case '0':
		default:
			return fmt.Errorf("%w: autograd: malformed tensor mask %q", ErrInvalidArgument, mask)
		}
	}
	if len(outs) == 0 {
		return nil
	}
	n := &node{kind: kindRecv, name: "recv from worker " + fmt.Sprint(from), peer: from, msg: msg}
	c.addOutputsLocked(n, outs)
	c.nodes = append(c.nodes, n)
	return nil
}
