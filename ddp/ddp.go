package ddp

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

// DDP trains one replica of a model in data-parallel with the replicas on the
// other ranks of a process group: each Step runs forward and backward on this
// rank's batch and leaves in every parameter's Grad the gradient averaged over
// all ranks, reduced in buckets while the backward pass is still running.
//
// A DDP is used from one goroutine at a time (Step, NoSync and Join
// serialize); Stats and Buckets may be called from any goroutine.
type DDP struct {
	pg    *comm.ProcessGroup
	model models.Module
	cfg   config
	world int
	rank  int

	params    []*models.Param // reduced: the model's parameters that require gradients
	allParams []*models.Param // the model's parameters, frozen ones included
	buffers   []*models.Param
	index     map[*models.Param]int

	mu    sync.Mutex // serializes Step, NoSync, Join
	progs programCache

	// bucket layout
	layoutMu    sync.Mutex // guards buckets and rebuiltFlag for Buckets() and Stats()
	rebuiltFlag bool
	buckets     []*bucket
	bucketOf    []int // per parameter: its bucket
	slotOf      []int // per parameter: its position in the bucket
	shadow      []*GradBucket
	noShared    bool // SharedBuckets found the transport unable to share memory

	// reducer state across steps
	cur            *stepState
	readyOrder     []int // the order gradients became ready in the first synchronized step
	rebuildPending bool
	rebuilt        bool
	accumulated    bool   // Grad views hold gradients of no-sync steps not yet reduced
	hasGrad        []bool // per parameter: Grad points at its bucket view
	// scratch: per parameter, where its gradient op writes in steps whose
	// gradients are added into the views (no-sync and the step after);
	// made on first use.
	scratch    []*tensor.Dense
	staticUsed []bool // StaticGraph: the global used map, once known
	noSync     int
	commActive atomic.Bool // reductions of the current step are in flight
	joined     bool        // inside Join: every step exchanges the join flags
	lastRoot   int         // inside Join: lowest rank of the last non-empty set of active ranks
	failed     error

	stats statsState
}

// New wraps model for data-parallel training over pg (nil: comm.Default()).
// Every rank of pg calls it with a model of the same parameter names, dtypes
// and shapes, in the same order, and the same options. New checks that (an
// error wrapping ErrMismatch names the first difference and the ranks), then
// overwrites every rank's parameters and buffers with rank 0's, and lays out
// the gradient buckets: parameters in reverse order (the order their
// gradients are expected to become ready), the first bucket capped at
// FirstBucketCapMB and the others at BucketCapMB. After the first step the
// buckets are rebuilt once in the order the gradients actually became ready
// on rank 0.
//
// The parameters' Grad fields belong to the DDP from now on: each points
// into its bucket once the parameter first has a gradient.
func New(ctx context.Context, pg *comm.ProcessGroup, model models.Module, opts ...Option) (*DDP, error) {
	if ctx == nil {
		return nil, fmt.Errorf("ddp: New: nil context: %w", ErrInvalidArgument)
	}
	if pg == nil {
		pg = comm.Default()
		if pg == nil {
			return nil, fmt.Errorf("ddp: New: no process group given and no default group; call comm.InitFromEnv first: %w", ErrInvalidArgument)
		}
	}
	if model == nil {
		return nil, fmt.Errorf("ddp: New: nil model: %w", ErrInvalidArgument)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	d := &DDP{pg: pg, model: model, cfg: cfg, world: pg.Size(), rank: pg.Rank(), index: map[*models.Param]int{}}
	d.progs.max = cfg.maxPrograms

	sig := replicaSig{Options: cfg.optionsSig()}
	localErr := d.collectState(&sig)
	if err := d.setup(ctx, sig, localErr); err != nil {
		return nil, err
	}
	d.logLayout("initial")
	return d, nil
}

// setup checks the replicas against each other (sig, or localErr when this
// rank could not describe its replica), copies rank 0's parameters and
// buffers to every rank and lays out the buckets.
func (d *DDP) setup(ctx context.Context, sig replicaSig, localErr error) error {
	pg := d.pg
	if localErr != nil {
		sig.Err = localErr.Error()
	}
	if err := verifyReplicas(ctx, pg, sig); err != nil {
		if localErr != nil {
			return localErr
		}
		return err
	}

	state := make([]*tensor.Dense, 0, len(d.allParams)+len(d.buffers))
	for _, p := range d.allParams {
		state = append(state, p.Value)
	}
	for _, b := range d.buffers {
		state = append(state, b.Value)
	}
	if err := broadcastTensors(ctx, pg, state, 0); err != nil {
		return fmt.Errorf("ddp: broadcasting rank 0's parameters and buffers: %w", err)
	}

	order := make([]int, len(d.params))
	for i := range order {
		order[i] = len(d.params) - 1 - i
	}
	if err := d.setLayout(ctx, order); err != nil {
		return err
	}
	d.hasGrad = make([]bool, len(d.params))
	return nil
}

// collectState lists the model's parameters and buffers, checks them and
// fills sig.
func (d *DDP) collectState(sig *replicaSig) error {
	d.allParams = d.model.Params()
	d.buffers = d.model.Buffers()
	names := map[string]bool{}
	seen := map[*models.Param]bool{}
	check := func(kind string, p *models.Param) error {
		if p == nil || p.Value == nil {
			return fmt.Errorf("ddp: the model has a %s without a value: %w", kind, ErrInvalidArgument)
		}
		if seen[p] || names[p.Name] {
			return fmt.Errorf("ddp: the model lists %s %q twice: %w", kind, p.Name, ErrInvalidArgument)
		}
		seen[p], names[p.Name] = true, true
		if p.Value.RequiresIterator() {
			return fmt.Errorf("ddp: %s %q is not contiguous in memory: %w", kind, p.Name, ErrInvalidArgument)
		}
		if !broadcastable(p.Value.Dtype()) {
			return fmt.Errorf("ddp: %s %q has dtype %v, which collectives cannot carry: %w", kind, p.Name, p.Value.Dtype(), ErrInvalidArgument)
		}
		sig.Entries = append(sig.Entries, sigOf(kind, p))
		return nil
	}
	for _, p := range d.allParams {
		if err := check("parameter", p); err != nil {
			return err
		}
		if !p.RequiresGrad {
			continue
		}
		if dt := p.Value.Dtype(); dt != tensor.Float64 && dt != tensor.Float32 {
			return fmt.Errorf("ddp: parameter %q has dtype %v; trainable parameters must be float32 or float64: %w", p.Name, dt, ErrInvalidArgument)
		}
		d.index[p] = len(d.params)
		d.params = append(d.params, p)
	}
	for _, b := range d.buffers {
		if err := check("buffer", b); err != nil {
			return err
		}
	}
	if len(d.params) == 0 {
		return fmt.Errorf("ddp: the model has no parameter that requires a gradient: %w", ErrInvalidArgument)
	}
	return nil
}

// setLayout assigns the parameters to buckets walking them in order, and
// moves existing gradients into the new buckets.
func (d *DDP) setLayout(ctx context.Context, order []int) error {
	bytes := make([]int64, len(d.params))
	dts := make([]tensor.Dtype, len(d.params))
	for i, p := range d.params {
		dts[i] = p.Value.Dtype()
		bytes[i] = int64(p.Value.Shape().TotalSize()) * int64(dts[i].Size())
	}
	assign := assignBuckets(order, bytes, dts, d.cfg.bucketLimits())
	if d.buckets != nil && sameAssignment(d.buckets, assign) {
		return nil
	}
	buckets, bucketOf, slotOf, err := layoutBuckets(ctx, d.params, assign, d)
	if err != nil {
		return err
	}
	if d.buckets != nil {
		for pi, p := range d.params {
			old := d.buckets[d.bucketOf[pi]].views[d.slotOf[pi]]
			nv := buckets[bucketOf[pi]].views[slotOf[pi]]
			if err := copyInto(nv, old, "moving a gradient to its new bucket"); err != nil {
				return err
			}
			if p.Grad == old {
				p.Grad = nv
			}
		}
	}
	d.layoutMu.Lock()
	old := d.buckets
	d.buckets, d.bucketOf, d.slotOf = buckets, bucketOf, slotOf
	d.shadow = nil
	d.layoutMu.Unlock()
	closeShared(old)
	return nil
}

func sameAssignment(bs []*bucket, assign [][]int) bool {
	if len(bs) != len(assign) {
		return false
	}
	for i, b := range bs {
		if !slices.Equal(b.params, assign[i]) {
			return false
		}
	}
	return true
}

// Parameters returns the model's parameters (frozen ones included), in
// state_dict order: what an optimizer is built over.
func (d *DDP) Parameters() []*models.Param { return slices.Clone(d.allParams) }

// Module returns the wrapped model.
func (d *DDP) Module() models.Module { return d.model }

// Group returns the process group the DDP reduces over.
func (d *DDP) Group() *comm.ProcessGroup { return d.pg }

// BucketInfo describes one bucket of the current layout.
type BucketInfo struct {
	Index    int
	Dtype    string
	Elements int
	Bytes    int64
	Params   []string // in the bucket's order
}

// Buckets returns the current bucket layout, in the order the buckets are
// reduced.
func (d *DDP) Buckets() []BucketInfo {
	d.layoutMu.Lock()
	defer d.layoutMu.Unlock()
	out := make([]BucketInfo, len(d.buckets))
	for i, b := range d.buckets {
		bi := BucketInfo{Index: i, Dtype: b.dtype.String(), Elements: b.numel, Bytes: int64(b.numel) * int64(b.dtype.Size())}
		for _, pi := range b.params {
			bi.Params = append(bi.Params, d.params[pi].Name)
		}
		out[i] = bi
	}
	return out
}

// fail records a failed step: the ranks are out of step now, so the group
// is aborted (every other rank fails promptly instead of waiting for its
// timeout) and the DDP refuses further steps.
func (d *DDP) fail(err error) {
	if d.failed != nil {
		return
	}
	d.failed = err
	d.pg.Abort(fmt.Errorf("ddp: rank %d's step failed: %w", d.rank, err))
}

// usable returns the error to report when an earlier step failed.
func (d *DDP) usable() error {
	if d.failed == nil {
		return nil
	}
	return fmt.Errorf("ddp: an earlier step failed and aborted the process group (%w); build a new group and DDP to go on: %w", d.failed, ErrClosed)
}
