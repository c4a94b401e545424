package ddp

import (
	"context"
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/models"
)

// Defaults of the bucketing options, as in PyTorch's DistributedDataParallel.
const (
	// DefaultBucketCapMB is the default cap of every bucket but the first,
	// in MiB (PyTorch's bucket_cap_mb).
	DefaultBucketCapMB = 25
	// DefaultFirstBucketCapMB is the default cap of the first bucket in MiB:
	// the first gradients to become ready go out in a small bucket, so
	// communication starts early in the backward pass.
	DefaultFirstBucketCapMB = 1
)

// LossFunc builds the loss of one step from the model's output node and the
// target node (the y given to Step), returning a scalar node. b is the
// builder of the step's graph, for losses that need parameters or extra
// inputs.
type LossFunc func(b *models.Builder, out, target *G.Node) (*G.Node, error)

// CrossEntropyLoss is the default LossFunc: models.CrossEntropy, the mean
// cross entropy over the batch (targets are int64 class indices [N] or class
// probabilities [N, C]).
func CrossEntropyLoss(_ *models.Builder, out, target *G.Node) (*G.Node, error) {
	return models.CrossEntropy(out, target)
}

// MSELoss is a LossFunc computing models.MSE, the mean squared error.
func MSELoss(_ *models.Builder, out, target *G.Node) (*G.Node, error) {
	return models.MSE(out, target)
}

// Option configures New.
type Option func(*config) error

type config struct {
	bucketCap      int64 // bytes
	firstBucketCap int64 // bytes; -1: min(DefaultFirstBucketCapMB, bucketCap)
	loss           LossFunc
	findUnused     bool
	staticGraph    bool
	syncBuffers    bool
	hook           hookFunc
	hookName       string
	workers        int
	builderOpts    []models.BuilderOption
	maxPrograms    int
	tape           bool // NewGraph: run under gorgonia's TapeMachine
	stragglerEvery int  // StragglerEvery; 0: comm.DefaultStragglerEvery
	timeline       *Timeline
	sharedBuckets  bool // SharedBuckets
}

func defaultConfig() config {
	return config{
		bucketCap:      mib(DefaultBucketCapMB),
		firstBucketCap: -1,
		loss:           CrossEntropyLoss,
		syncBuffers:    true,
		maxPrograms:    4,
		sharedBuckets:  true,
	}
}

func mib(mb float64) int64 { return int64(math.Round(mb * (1 << 20))) }

// BucketCapMB caps the size of every bucket but the first at mb MiB
// (default 25, PyTorch's bucket_cap_mb). Gradients are packed into a bucket
// until it reaches the cap; the parameter that crosses the cap still joins
// it, so a bucket holds at least one parameter. Smaller buckets start
// communicating earlier but cost more collectives.
func BucketCapMB(mb float64) Option {
	return func(c *config) error {
		if !(mb > 0) || math.IsInf(mb, 0) {
			return fmt.Errorf("ddp: BucketCapMB(%v): the cap must be a positive number of MiB: %w", mb, ErrInvalidArgument)
		}
		c.bucketCap = max(mib(mb), 1)
		return nil
	}
}

// FirstBucketCapMB caps the first bucket (the one holding the gradients that
// are ready first) at mb MiB. By default the cap is DefaultFirstBucketCapMB
// (1 MiB) or BucketCapMB when that is smaller.
func FirstBucketCapMB(mb float64) Option {
	return func(c *config) error {
		if !(mb > 0) || math.IsInf(mb, 0) {
			return fmt.Errorf("ddp: FirstBucketCapMB(%v): the cap must be a positive number of MiB: %w", mb, ErrInvalidArgument)
		}
		c.firstBucketCap = max(mib(mb), 1)
		return nil
	}
}

// WithLoss sets how Step turns the model's output and the target into the
// loss (default CrossEntropyLoss).
func WithLoss(fn LossFunc) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("ddp: WithLoss(nil): %w", ErrInvalidArgument)
		}
		c.loss = fn
		return nil
	}
}

// FindUnusedParameters allows parameters that take no part in a step's loss
// (PyTorch's find_unused_parameters). Such a parameter is marked ready at the
// start of the backward pass with a zero gradient, so its bucket is not held
// up, and the ranks all-reduce a map of which parameters each used: a
// parameter no rank used keeps a nil Grad until some step uses it, as in
// PyTorch. Without this option a parameter missing from the loss is an error.
func FindUnusedParameters(on bool) Option {
	return func(c *config) error { c.findUnused = on; return nil }
}

// StaticGraph declares that every step uses the same set of parameters
// (PyTorch's static_graph). Unused parameters are then allowed, as with
// FindUnusedParameters, but the map of used parameters is all-reduced on the
// first synchronized step only and reused afterwards, saving a collective per
// step.
func StaticGraph(on bool) Option {
	return func(c *config) error { c.staticGraph = on; return nil }
}

// SharedBuckets sets whether the gradient buckets live in memory that
// every rank maps (comm's shared tensors, ProcessGroup.NewSharedTensor;
// default true). Gradients are then computed where the peers read them,
// and each bucket's all-reduce runs in place through that memory, with no
// byte through the transport (the default comm hook, or a hook that
// all-reduces the bucket's own buffer). It needs every rank on one host
// (the shm backend, or in-process ranks); on other transports the buckets
// are ordinary memory. The buckets take world × their size of /dev/shm;
// where it has no room for a bucket (containers often keep it at 64 MiB)
// that bucket and the rest are ordinary memory on every rank, and the
// group's logger says so once. The shared memory of buckets laid out again
// (after the first step, in the order gradients became ready) is given
// back, their values kept in private memory. SharedBuckets(false) keeps
// every bucket in private memory.
func SharedBuckets(on bool) Option {
	return func(c *config) error { c.sharedBuckets = on; return nil }
}

// BroadcastBuffers sets whether the model's buffers (running statistics)
// are broadcast from rank 0 at the start of every step (default true, as
// PyTorch's broadcast_buffers), so every replica normalises with the same
// statistics. Buffers are always broadcast once by New.
func BroadcastBuffers(on bool) Option {
	return func(c *config) error { c.syncBuffers = on; return nil }
}

// Workers sets how many graph nodes the executor runs at once during a step
// (graph.Workers; default GOMAXPROCS). Workers(1) runs forward and backward on
// the goroutine calling Step, in a fixed order.
func Workers(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("ddp: Workers(%d): need at least one: %w", n, ErrInvalidArgument)
		}
		c.workers = n
		return nil
	}
}

// WithBuilderOptions passes options to the models.Builder that builds each
// step's graph (for example models.WithBuilderRand for dropout masks).
// DDP always builds in training mode.
func WithBuilderOptions(opts ...models.BuilderOption) Option {
	return func(c *config) error { c.builderOpts = append(c.builderOpts, opts...); return nil }
}

// MaxPrograms bounds how many compiled graphs (one per distinct input shape,
// for example the short last batch of an epoch) Step keeps; the least
// recently used is dropped beyond it (default 4).
func MaxPrograms(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("ddp: MaxPrograms(%d): need at least one: %w", n, ErrInvalidArgument)
		}
		c.maxPrograms = n
		return nil
	}
}

// WithCommHook replaces the default gradient reduction by hook, called once
// per bucket and step with state (PyTorch's register_comm_hook). The hook
// receives the bucket of local gradients and returns a Future of the
// bucket's reduced gradients (see CommHook for the rules). Built-in hooks:
// AllReduceHook, FP16CompressHook, BF16CompressHook (state: the group to
// reduce over, nil for the DDP's own) and PowerSGDHook (state: a
// *PowerSGDState):
//
//	ddp.WithCommHook[*comm.ProcessGroup](nil, ddp.FP16CompressHook)
//	cfg := ddp.DefaultPowerSGDConfig()
//	cfg.Rank = 2
//	st, err := ddp.NewPowerSGDState(nil, cfg)
//	ddp.WithCommHook(st, ddp.PowerSGDHook)
func WithCommHook[S any](state S, hook CommHook[S]) Option {
	return func(c *config) error {
		if hook == nil {
			return fmt.Errorf("ddp: WithCommHook: nil hook: %w", ErrInvalidArgument)
		}
		c.hook = func(ctx context.Context, b *GradBucket) Future { return hook(ctx, state, b) }
		c.hookName = fmt.Sprintf("%T", state)
		return nil
	}
}
