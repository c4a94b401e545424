package ddp

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// program is the model's forward and backward pass compiled for one input
// shape.
type program struct {
	key    string
	prog   *graph.Program
	x, y   *G.Node
	loss   *G.Node
	used   []bool // per DDP parameter: has a gradient in this graph
	unused []int  // DDP parameters without one
	grads  int    // number of used parameters
	hooked []int  // the used parameters, in gradient-node order
	b      *models.Builder
	syncBN bool // the graph holds SyncBatchNorm collectives
	lru    uint64
}

// programCache keeps the compiled programs by input shape.
type programCache struct {
	max   int
	clock uint64
	progs map[string]*program
}

func inputKey(x, y *tensor.Dense) string {
	return fmt.Sprintf("%v%v|%v%v", x.Dtype(), x.Shape(), y.Dtype(), y.Shape())
}

// program returns the compiled program for inputs shaped like x and y,
// building it on first use.
func (d *DDP) program(x, y *tensor.Dense) (*program, error) {
	if x == nil || y == nil {
		return nil, fmt.Errorf("ddp: Step needs an input and a target, got nil: %w", ErrInvalidArgument)
	}
	key := inputKey(x, y)
	c := &d.progs
	c.clock++
	if p, ok := c.progs[key]; ok {
		p.lru = c.clock
		return p, nil
	}
	p, err := d.compile(x, y)
	if err != nil {
		return nil, err
	}
	p.key, p.lru = key, c.clock
	if c.progs == nil {
		c.progs = map[string]*program{}
	}
	if len(c.progs) >= c.max {
		var oldest *program
		for _, q := range c.progs {
			if oldest == nil || q.lru < oldest.lru {
				oldest = q
			}
		}
		delete(c.progs, oldest.key)
	}
	c.progs[key] = p
	return p, nil
}

// buildMu serializes graph construction in this process. gorgonia keeps
// package-level constant nodes (the 1 that seeds every gradient) whose hash
// it computes lazily on first use, so two goroutines differentiating graphs
// at the same moment (goroutine ranks of one process) race on it. Building
// happens once per input shape, so the lock costs nothing in steady state.
var buildMu sync.Mutex

// compile builds the model's graph on placeholders shaped like x and y,
// differentiates the loss and compiles it with a gradient hook per
// parameter.
func (d *DDP) compile(x, y *tensor.Dense) (*program, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	opts := append([]models.BuilderOption{}, d.cfg.builderOpts...)
	opts = append(opts, models.WithMode(models.Train))
	b := models.NewBuilder(nil, opts...)
	xn := b.Bind("x", placeholder(x))
	yn := b.Bind("y", placeholder(y))
	out, err := d.model.Forward(b, xn)
	if err != nil {
		return nil, fmt.Errorf("ddp: building the model's forward pass for input %v %v: %w", x.Dtype(), x.Shape(), err)
	}
	loss, err := d.cfg.loss(b, out, yn)
	if err != nil {
		return nil, fmt.Errorf("ddp: building the loss for output %v and target %v %v: %w", out.Shape(), y.Dtype(), y.Shape(), err)
	}
	if !loss.IsScalar() {
		return nil, fmt.Errorf("ddp: the loss has shape %v; it must be a scalar: %w", loss.Shape(), ErrInvalidArgument)
	}
	if err := b.Backward(loss); err != nil {
		return nil, fmt.Errorf("ddp: differentiating the loss: %w", err)
	}
	p := &program{x: xn, y: yn, loss: loss, used: make([]bool, len(d.params))}
	for _, n := range b.Graph().AllNodes() {
		if _, ok := n.Op().(sbnOp); ok {
			p.syncBN = true
			break
		}
	}
	var wrt, grads G.Nodes
	var hooked []int
	for _, mp := range b.GradParams() {
		pi, ok := d.index[mp]
		if !ok {
			continue // a parameter of the loss, not of the model: not reduced
		}
		n, err := b.Node(mp)
		if err != nil {
			return nil, err
		}
		p.used[pi] = true
		wrt = append(wrt, n)
		grads = append(grads, b.GradNode(mp))
		hooked = append(hooked, pi)
	}
	for pi, u := range p.used {
		if !u {
			p.unused = append(p.unused, pi)
		}
	}
	p.grads = len(hooked)
	p.hooked, p.b = hooked, b
	if len(p.unused) > 0 && !d.cfg.findUnused && !d.cfg.staticGraph {
		var names []*models.Param
		for _, pi := range p.unused {
			names = append(names, d.params[pi])
		}
		return nil, fmt.Errorf("ddp: parameters %s take no part in the loss; pass ddp.FindUnusedParameters(true) (or ddp.StaticGraph(true) when the set never changes) to train a model with unused parameters: %w",
			joinNames(names), ErrInvalidArgument)
	}
	copts := []graph.Option{graph.WithGrads(wrt, grads)}
	if d.cfg.workers > 0 {
		copts = append(copts, graph.Workers(d.cfg.workers))
	}
	prog, err := graph.Compile(b.Graph(), copts...)
	if err != nil {
		return nil, fmt.Errorf("ddp: compiling the training graph: %w", err)
	}
	for k, pi := range hooked {
		if err := prog.OnGradReady(wrt[k], func(_ context.Context, _ *G.Node, v G.Value) error {
			return d.cur.gradReady(pi, v)
		}); err != nil {
			return nil, err
		}
	}
	// The loss is the forward pass's last value: Stats and the timeline
	// split the run there into forward and backward.
	if err := prog.OnNodeReady(p.loss, func(context.Context, *G.Node, G.Value) error {
		if s := d.cur; s != nil {
			s.forwardEnd = time.Now()
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if d.world > 1 && runtime.GOMAXPROCS(0) == 1 {
		// With a single P, the goroutines moving a bucket's data only run
		// when the backward pass lets them: offer them the processor
		// between nodes while reductions are in flight, instead of leaving
		// them to the scheduler's 10 ms preemption.
		prog.OnReady(func(context.Context, *G.Node, G.Value) error {
			if d.commActive.Load() {
				runtime.Gosched()
			}
			return nil
		})
	}
	p.prog = prog
	return p, nil
}

// aimGrads tells each used parameter's gradient op where to write in this
// step. When the step reduces and no no-sync step accumulated before it,
// that is the parameter's view in its bucket, the op multiplying by 1/world
// for the default reduction: the gradient is computed in place, with no copy
// into the bucket (PyTorch's gradient_as_bucket_view). Otherwise it is a
// tensor of DDP's own, from which gradReady adds into the view. Parameters
// whose ops cannot write into a given tensor keep the executor's buffers
// and are copied as before.
func (d *DDP) aimGrads(p *program, s *stepState) {
	direct := s.pl.sync && !s.accum
	scale := 1.0
	if s.scale {
		scale = s.inv64
	}
	for _, pi := range p.hooked {
		mp := d.params[pi]
		if direct {
			p.b.SetGradTarget(p.prog, mp, d.view(pi), scale)
			continue
		}
		if d.scratch == nil {
			d.scratch = make([]*tensor.Dense, len(d.params))
		}
		if d.scratch[pi] == nil {
			d.scratch[pi] = tensor.New(tensor.Of(mp.Value.Dtype()), tensor.WithShape(mp.Value.Shape().Clone()...))
		}
		p.b.SetGradTarget(p.prog, mp, d.scratch[pi], 1)
	}
}

// placeholder returns a zero tensor shaped like t, to build the graph on.
func placeholder(t *tensor.Dense) *tensor.Dense {
	if t.IsScalar() {
		return tensor.New(tensor.Of(t.Dtype()), tensor.WithShape())
	}
	return tensor.New(tensor.Of(t.Dtype()), tensor.WithShape(t.Shape().Clone()...))
}

// lossValue reads a scalar loss value.
func lossValue(v G.Value) (float64, error) {
	switch x := v.(type) {
	case *tensor.Dense:
		switch x.Dtype() {
		case tensor.Float64:
			return x.Float64s()[0], nil
		case tensor.Float32:
			return float64(x.Float32s()[0]), nil
		}
	case *G.F64:
		return float64(*x), nil
	case *G.F32:
		return float64(*x), nil
	}
	return 0, fmt.Errorf("ddp: the loss value is %T; want a float32 or float64 scalar: %w", v, ErrInvalidArgument)
}
