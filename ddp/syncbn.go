package ddp

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/ops/dist"
)

// SyncBatchNorm is batch normalization whose batch statistics are those of
// the global batch, every rank's examples together (PyTorch's
// nn.SyncBatchNorm): in training mode each forward pass all-reduces the
// per-channel sums and counts, then the sums of squared deviations from the
// global mean, over Group, and normalizes with the global mean and biased
// variance; the running statistics are updated with the global mean and
// unbiased variance. The gradient flows back through the same collectives
// (package ops/dist), so it is the gradient of the sum of every rank's
// loss, as in PyTorch. In evaluation mode it is plain batch normalization
// with the running statistics.
//
// It wraps a models.BatchNorm2d, whose parameters, buffers, eps and momentum
// it uses (state_dict names unchanged), and accepts inputs [N, C, ...] of
// any rank of at least two. Group should be a group of its own, not the one
// DDP reduces gradients over: its collectives run inside the graph, and
// DDP's bucket reductions on the same group could be interleaved with them
// in different orders on different ranks. ConvertSyncBatchNorm makes such a
// group. A model with SyncBatchNorm cannot train inside Join: a joined rank
// does not run the forward pass these collectives need.
type SyncBatchNorm struct {
	*models.BatchNorm2d
	Group *comm.ProcessGroup
}

// NewSyncBatchNorm returns a SyncBatchNorm over bn's state reducing over
// group.
func NewSyncBatchNorm(bn *models.BatchNorm2d, group *comm.ProcessGroup) (*SyncBatchNorm, error) {
	if bn == nil || group == nil {
		return nil, fmt.Errorf("ddp: NewSyncBatchNorm needs a BatchNorm2d and a group: %w", ErrInvalidArgument)
	}
	return &SyncBatchNorm{BatchNorm2d: bn, Group: group}, nil
}

// ConvertSyncBatchNorm replaces every models.BatchNorm2d inside m's
// Sequential containers (nested ones included) by a SyncBatchNorm over the
// same state, reducing over a new group with the members of pg (made with
// pg.NewGroup, so every rank of pg must call ConvertSyncBatchNorm). It
// returns m, changed in place (or a SyncBatchNorm when m is itself a
// BatchNorm2d), and the number of layers converted. Modules other than
// Sequential are not looked into; build SyncBatchNorm layers into them with
// NewSyncBatchNorm.
func ConvertSyncBatchNorm(ctx context.Context, pg *comm.ProcessGroup, m models.Module) (models.Module, int, error) {
	if pg == nil || m == nil {
		return nil, 0, fmt.Errorf("ddp: ConvertSyncBatchNorm needs a group and a model: %w", ErrInvalidArgument)
	}
	ranks := make([]int, pg.Size())
	for i := range ranks {
		ranks[i] = i
	}
	group, err := pg.NewGroup(ctx, ranks, comm.WithName(pg.Name()+"/syncbn"))
	if err != nil {
		return nil, 0, fmt.Errorf("ddp: making SyncBatchNorm's group: %w", err)
	}
	n := 0
	var convert func(models.Module) models.Module
	convert = func(m models.Module) models.Module {
		switch v := m.(type) {
		case *models.BatchNorm2d:
			n++
			return &SyncBatchNorm{BatchNorm2d: v, Group: group}
		case *models.Sequential:
			for i, l := range v.Layers {
				v.Layers[i] = convert(l)
			}
		}
		return m
	}
	return convert(m), n, nil
}

// Forward normalizes x of shape [N, C, ...].
func (l *SyncBatchNorm) Forward(b *models.Builder, x *G.Node) (*G.Node, error) {
	bn := l.BatchNorm2d
	xs := x.Shape()
	if len(xs) < 2 || xs[1] != bn.C {
		return nil, fmt.Errorf("ddp: SyncBatchNorm over %d channels needs an input [N, %d, ...], got %v: %w", bn.C, bn.C, xs, ErrInvalidArgument)
	}
	base := sbnOp{dims: len(xs), c: bn.C, eps: bn.Eps, momentum: bn.Momentum, affine: bn.Weight != nil, layer: bn}
	apply := func(k sbnKind, in ...*G.Node) (*G.Node, error) {
		op := base
		op.kind = k
		return G.ApplyOp(op, in...)
	}
	var w, bias *G.Node
	if base.affine {
		var err error
		if w, err = b.Node(bn.Weight); err != nil {
			return nil, err
		}
		if bias, err = b.Node(bn.Bias); err != nil {
			return nil, err
		}
	}
	var mean, variance *G.Node
	if !b.Training() {
		var err error
		if mean, err = b.Node(bn.RunningMean); err != nil {
			return nil, err
		}
		if variance, err = b.Node(bn.RunningVar); err != nil {
			return nil, err
		}
	} else {
		local, err := apply(sbnStats, x)
		if err != nil {
			return nil, err
		}
		e1, err := dist.AllReduce(l.Group, local, comm.Sum)
		if err != nil {
			return nil, err
		}
		if mean, err = apply(sbnMean, e1); err != nil {
			return nil, err
		}
		sq, err := apply(sbnSqDev, x, mean)
		if err != nil {
			return nil, err
		}
		q, err := dist.AllReduce(l.Group, sq, comm.Sum)
		if err != nil {
			return nil, err
		}
		if variance, err = apply(sbnVar, q, e1); err != nil {
			return nil, err
		}
		op := base
		op.kind = sbnRunning
		if _, err := G.ApplyOp(op, mean, variance, e1); err != nil {
			return nil, err
		}
	}
	if base.affine {
		return apply(sbnNorm, x, mean, variance, w, bias)
	}
	return apply(sbnNorm, x, mean, variance)
}
