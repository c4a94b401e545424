package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// The test job: an MLP 6-16-4 in float64 on a fixed synthetic set of 96
// examples, SGD with momentum, a global batch of 12 (which 1, 2, 3, 4 and 6
// members divide).
const (
	nExamples  = 96
	nFeatures  = 6
	nClasses   = 4
	globalSize = 12
	baseLR     = 0.05
)

func testSet(t testing.TB) *data.TensorDataset {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 7))
	x := make([]float64, nExamples*nFeatures)
	y := make([]int64, nExamples)
	for i := range nExamples {
		c := r.IntN(nClasses)
		y[i] = int64(c)
		for j := range nFeatures {
			x[i*nFeatures+j] = r.NormFloat64()*0.5 + float64((c+j)%nClasses)
		}
	}
	ds, err := data.NewTensorDataset([]string{"x", "y"},
		tensor.New(tensor.WithShape(nExamples, nFeatures), tensor.WithBacking(x)),
		tensor.New(tensor.WithShape(nExamples), tensor.WithBacking(y)))
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// member is one process's (or goroutine's) part of the test job.
type member struct {
	id     string
	m      *elastic.Manager
	model  *models.Sequential
	opt    optim.Optimizer
	net    *ddp.DDP
	loader *data.Loader
	stream *elastic.Stream
	seed   uint64
	// round is the round the member runs in.
	round elastic.Round
	// beforeStep, when set, runs before each step with the step about to
	// run; an error stops the member there (a simulated death).
	beforeStep func(step int64) error
	// afterCommit runs after each committed step.
	afterCommit func(step int64)
}

func newMember(t testing.TB, ctx context.Context, st store.Store, id string, seed uint64, cfg elastic.Config) *member {
	t.Helper()
	// Every member starts from its own weights: healing must fix that.
	model, err := models.NewMLP([]int{nFeatures, 16, nClasses}, models.WithActivation(models.ActTanh), models.WithRand(rand.New(rand.NewPCG(seed, 1))), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(baseLR), optim.Momentum(0.9))
	if err != nil {
		t.Fatal(err)
	}
	loader, err := data.NewTensorLoader(testSet(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	sampler, err := data.NewRandomSampler(nExamples, 3)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := elastic.NewStream(sampler)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID = id
	if cfg.Batch == nil {
		cfg.Batch = elastic.FixedGlobalBatch(globalSize)
	}
	m, err := elastic.New(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &member{id: id, m: m, model: model, opt: opt, loader: loader, stream: stream, seed: seed}
}

// train runs until the job has committed steps steps.
func (mb *member) train(ctx context.Context, steps int64) error {
	state := elastic.ModuleState(mb.model, mb.opt)
	for mb.m.Progress().Step < steps {
		r, err := mb.m.Quorum(ctx, state)
		if err != nil {
			return fmt.Errorf("%s: quorum: %w", mb.id, err)
		}
		mb.round = r
		if r.Changed {
			if mb.net, err = ddp.New(ctx, r.Group, mb.model); err != nil {
				// The round broke while DDP set up: the next Quorum
				// forms another.
				if _, cerr := mb.m.Commit(ctx, err); cerr != nil {
					return fmt.Errorf("%s: ddp: %w", mb.id, cerr)
				}
				continue
			}
			mb.opt.SetLR(baseLR * r.LRScale)
		}
		if mb.beforeStep != nil {
			if err := mb.beforeStep(mb.m.Progress().Step); err != nil {
				return err
			}
		}
		b, err := mb.loader.Batch(ctx, mb.m.Indices(mb.stream))
		if err != nil {
			return err
		}
		_, stepErr := mb.net.Step(ctx, b.X, b.Y)
		ok, err := mb.m.Commit(ctx, stepErr)
		if err != nil {
			return fmt.Errorf("%s: step: %w", mb.id, err)
		}
		if ok {
			if err := mb.opt.Step(); err != nil {
				return err
			}
			if mb.afterCommit != nil {
				mb.afterCommit(mb.m.Progress().Step)
			}
		}
	}
	return nil
}

// params returns the model's parameters, flattened.
func (mb *member) params() []float64 {
	var out []float64
	for _, p := range mb.model.Params() {
		out = append(out, p.Value.Data().([]float64)...)
	}
	return out
}

// reference trains the job alone for steps steps: what every membership
// history must reproduce under FixedGlobalBatch.
func reference(t testing.TB, steps int64) []float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := store.NewMemory()
	defer st.Close()
	mb := newMember(t, ctx, st, "reference", 1, elastic.Config{Job: "ref", LastCall: time.Millisecond})
	defer mb.m.Close()
	if err := mb.train(ctx, steps); err != nil {
		t.Fatal(err)
	}
	return mb.params()
}

func maxDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

var errDied = errors.New("simulated death")
