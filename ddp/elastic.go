package ddp

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// Elastic is DDP whose membership may change while it trains: each Step
// runs in the current round of an elastic.Manager, rebuilding the DDP over
// the round's process group when the round changes (a member was lost, or
// one arrived and was healed), and applies the optimizer's update only when
// every member's step succeeded (elastic.Manager.Commit). The learning rate
// is the optimizer's at construction times the round's LRScale.
//
//	m, err := elastic.New(ctx, st, elastic.Config{MinSize: 2, Batch: elastic.FixedGlobalBatch(96)})
//	net := ddp.NewElastic(m, stream, model, opt)
//	for m.Progress().Step < steps {
//		loss, committed, err := net.Step(ctx, func(ctx context.Context, idx []int) (x, y *tensor.Dense, err error) {
//			b, err := loader.Batch(ctx, idx)
//			if err != nil {
//				return nil, nil, err
//			}
//			return b.X, b.Y, nil
//		})
//	}
type Elastic struct {
	m      *elastic.Manager
	stream *elastic.Stream
	model  models.Module
	opt    optim.Optimizer
	opts   []Option
	baseLR float64
	net    *DDP
	round  elastic.Round
}

// BatchFunc returns the inputs and targets of the examples indices (this
// member's share of the step's global batch).
type BatchFunc func(ctx context.Context, indices []int) (x, y *tensor.Dense, err error)

// NewElastic returns the elastic DDP of model, trained by opt, in the job
// of m, over the data order of stream. opts are the DDP options of every
// round's New. Its first Step joins the first round.
func NewElastic(m *elastic.Manager, stream *elastic.Stream, model models.Module, opt optim.Optimizer, opts ...Option) *Elastic {
	return &Elastic{m: m, stream: stream, model: model, opt: opt, opts: opts, baseLR: opt.LR()}
}

// Step runs one step in the current round (forming a new one first when
// needed): it takes this member's examples from batch, runs DDP's forward
// and backward, and votes with the other members. committed reports
// whether the step counted (the optimizer's update was applied and
// Manager.Progress advanced); a step that did not count was discarded on
// every member, and the next Step forms a new round. err is a failure of
// this member's own (a bad batch, a round that cannot form), not a lost
// peer.
func (e *Elastic) Step(ctx context.Context, batch BatchFunc) (loss float64, committed bool, err error) {
	if e.m == nil || e.stream == nil || e.model == nil || e.opt == nil || batch == nil {
		return 0, false, fmt.Errorf("ddp: Elastic.Step: nil manager, stream, model, optimizer or batch function: %w", ErrInvalidArgument)
	}
	r, err := e.m.Quorum(ctx, elastic.ModuleState(e.model, e.opt))
	if err != nil {
		return 0, false, err
	}
	if r.Changed {
		e.round = r
		e.net = nil
		net, err := New(ctx, r.Group, e.model, e.opts...)
		if err != nil {
			// The round broke while DDP set it up: vote the step down.
			_, err := e.m.Commit(ctx, err)
			return 0, false, err
		}
		e.net = net
		e.opt.SetLR(e.baseLR * r.LRScale)
	}
	x, y, err := batch(ctx, e.m.Indices(e.stream))
	if err != nil {
		return 0, false, fmt.Errorf("ddp: Elastic.Step: the batch: %w", err)
	}
	loss, stepErr := e.net.Step(ctx, x, y)
	ok, err := e.m.Commit(ctx, stepErr)
	if err != nil || !ok {
		return 0, false, err
	}
	if err := e.opt.Step(); err != nil {
		return loss, false, fmt.Errorf("ddp: Elastic.Step: the optimizer: %w", err)
	}
	return loss, true, nil
}

// Round is the round of the last Step.
func (e *Elastic) Round() elastic.Round { return e.round }

// DDP is the current round's DDP (nil before the first Step and while a
// round is being formed).
func (e *Elastic) DDP() *DDP { return e.net }

// SetBaseLR changes the learning rate the rounds scale (for a schedule):
// the optimizer's rate becomes lr times the current round's LRScale.
func (e *Elastic) SetBaseLR(lr float64) {
	e.baseLR = lr
	if e.round.LRScale > 0 {
		e.opt.SetLR(lr * e.round.LRScale)
	}
}
