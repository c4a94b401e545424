package graph

import (
	"fmt"
	"runtime"

	G "gorgonia.org/gorgonia"
)

// Option configures Compile.
type Option func(*config) error

type config struct {
	workers   int
	reuse     bool
	evalMode  bool
	gradWRT   G.Nodes
	gradNodes G.Nodes
	dual      G.Nodes
	dualAll   bool
	last      G.Nodes
}

func defaultConfig() config {
	return config{workers: runtime.GOMAXPROCS(0), reuse: true}
}

// Workers sets how many nodes may run at the same time. Workers(1) runs the
// nodes one after the other in the topological order gorgonia's TapeMachine
// uses, on the goroutine that called Run, which makes a run deterministic.
// The default is runtime.GOMAXPROCS(0).
func Workers(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("graph: Workers(%d): need at least one worker: %w", n, ErrInvalidArgument)
		}
		c.workers = n
		return nil
	}
}

// ReuseBuffers turns the reuse of output buffers between runs on (the
// default) or off. With reuse on, an op that supports it
// (gorgonia.UsePreallocDoer, or ContextDoer) writes its result into the
// buffer it produced in the previous run, so a value read after Run is valid
// until the next Run of the same program: clone it to keep it longer. With
// reuse off every run gets freshly allocated values, as with TapeMachine.
func ReuseBuffers(on bool) Option {
	return func(c *config) error { c.reuse = on; return nil }
}

// EvalMode tells ops that implement gorgonia.TrainModeOp (dropout, batch
// norm) to run in evaluation mode. Without it Compile puts them in training
// mode, as gorgonia.NewTapeMachine does.
func EvalMode() Option {
	return func(c *config) error { c.evalMode = true; return nil }
}

// WithGrads records which gradient node belongs to which differentiated node:
// pass the nodes given to gorgonia.Grad and the nodes it returned, in the same
// order. Program.Grad, Program.GradNode and Program.OnGradReady then use this
// mapping (without it they fall back to gorgonia's Node.Deriv).
func WithGrads(wrt, grads G.Nodes) Option {
	return func(c *config) error {
		if len(wrt) != len(grads) {
			return fmt.Errorf("graph: WithGrads: %d nodes but %d gradients; pass gorgonia.Grad's arguments and its result: %w",
				len(wrt), len(grads), ErrInvalidArgument)
		}
		for i := range wrt {
			if wrt[i] == nil || grads[i] == nil {
				return fmt.Errorf("graph: WithGrads: nil node at position %d: %w", i, ErrInvalidArgument)
			}
		}
		c.gradWRT = append(c.gradWRT, wrt...)
		c.gradNodes = append(c.gradNodes, grads...)
		return nil
	}
}

// BindDualValues makes a run store each gradient in the dual value of the node
// it is the gradient of, as gorgonia's TapeMachine option of the same name
// does: after a run, n.Grad() returns the gradient, and gorgonia's solvers
// (which read n.Grad() and zero it after their step) work on the nodes. As
// with TapeMachine the gradient is added to what the dual value already holds,
// so gradients accumulate over runs until something zeroes them. With no
// nodes, every node that has a gradient node gets its dual value bound.
func BindDualValues(nodes ...*G.Node) Option {
	return func(c *config) error {
		if len(nodes) == 0 {
			c.dualAll = true
		}
		c.dual = append(c.dual, nodes...)
		return nil
	}
}

// RunLast makes a run compute these nodes after every other node of the
// program, one after the other in the order given, whatever the number of
// Workers. It is for an op that writes into memory other nodes read: a
// parameter update fused into the product that computes the parameter's
// gradient (models.WithSGDInBackward) must wait until every node that reads
// the parameter is done. The nodes must be computed by ops (not inputs,
// gorgonia.Set or gorgonia.Read), and no node of the program may read them.
func RunLast(nodes ...*G.Node) Option {
	return func(c *config) error {
		for i, n := range nodes {
			if n == nil {
				return fmt.Errorf("graph: RunLast: nil node at position %d: %w", i, ErrInvalidArgument)
			}
		}
		c.last = append(c.last, nodes...)
		return nil
	}
}
