package main

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// stepper runs one synchronized training step on this rank's batch: forward,
// backward, and every parameter's Grad set to the gradient averaged over all
// ranks, so that the optimizer's Step, run next on every rank, keeps the
// replicas identical.
type stepper interface {
	Step(ctx context.Context, x, y *tensor.Dense) (float64, error)
}

// syncStep is a stepper that averages gradients after the backward pass with
// one coalesced all-reduce.
type syncStep struct {
	pg    *comm.ProcessGroup
	model models.Module
	progs map[string]*stepProgram // by input shape
}

// stepProgram is the compiled graph of one input shape.
type stepProgram struct {
	b      *models.Builder
	prog   *graph.Program
	x, y   *G.Node
	loss   *G.Node
	grads  []*tensor.Dense // the Params' Grad tensors, in all-reduce order
	params []*models.Param
}

func newSyncStep(pg *comm.ProcessGroup, model models.Module) *syncStep {
	return &syncStep{pg: pg, model: model, progs: map[string]*stepProgram{}}
}

func (s *syncStep) program(x, y *tensor.Dense) (*stepProgram, error) {
	key := fmt.Sprint(x.Shape(), y.Shape())
	if p, ok := s.progs[key]; ok {
		return p, nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	b := models.NewBuilder(nil)
	xn, yn := b.Bind("x", x), b.Bind("y", y)
	out, err := s.model.Forward(b, xn)
	if err != nil {
		return nil, err
	}
	loss, err := models.CrossEntropy(out, yn)
	if err != nil {
		return nil, err
	}
	if err := b.Backward(loss); err != nil {
		return nil, err
	}
	prog, err := graph.Compile(b.Graph(), graph.WithGrads(b.ParamNodes(), b.GradNodes()))
	if err != nil {
		return nil, err
	}
	p := &stepProgram{b: b, prog: prog, x: xn, y: yn, loss: loss, params: b.GradParams()}
	s.progs[key] = p
	return p, nil
}

// Step implements stepper.
func (s *syncStep) Step(ctx context.Context, x, y *tensor.Dense) (float64, error) {
	p, err := s.program(x, y)
	if err != nil {
		return 0, fmt.Errorf("building the training graph: %w", err)
	}
	if err := p.prog.Run(ctx, graph.Bind(p.x, x), graph.Bind(p.y, y)); err != nil {
		return 0, err
	}
	if err := p.b.CopyGrads(); err != nil {
		return 0, err
	}
	if p.grads == nil {
		for _, q := range p.params {
			p.grads = append(p.grads, q.Grad)
		}
	}
	if s.pg.Size() > 1 {
		if err := s.pg.AllReduceCoalesced(ctx, p.grads, comm.Avg).Wait(ctx); err != nil {
			return 0, fmt.Errorf("averaging gradients: %w", err)
		}
	}
	return scalarValue(p.loss.Value())
}

// scalarValue reads a scalar graph value as float64.
func scalarValue(v G.Value) (float64, error) {
	switch x := v.Data().(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case []float32:
		if len(x) == 1 {
			return float64(x[0]), nil
		}
	case []float64:
		if len(x) == 1 {
			return x[0], nil
		}
	}
	return 0, fmt.Errorf("loss value %v is not a float scalar", v)
}
