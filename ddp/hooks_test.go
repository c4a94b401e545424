package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
)

var hookSizes = []int{12, 16, 8, 3}

// gradRun trains an MLP of hookSizes for steps steps on world goroutine
// ranks (batch rows a rank, SGD without momentum) with the options that
// opts gives each rank, and returns every rank's gradients after each step
// (flattened, in parameter order) and the DDPs.
func gradRun(t *testing.T, world, steps, rows int, opts func(r int, pg *comm.ProcessGroup) []ddp.Option) ([][][]float64, []*ddp.DDP) {
	t.Helper()
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	grads := make([][][]float64, world)
	nets := make([]*ddp.DDP, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		m := newMLP(t, hookSizes, 3)
		var o []ddp.Option
		if opts != nil {
			o = opts(r, pgs[r])
		}
		net, err := ddp.New(ctx, pgs[r], m, o...)
		if err != nil {
			return err
		}
		nets[r] = net
		for s := 0; s < steps; s++ {
			x, y := batch(uint64(100*s+r), rows, hookSizes[0], hookSizes[len(hookSizes)-1])
			if _, err := net.Step(ctx, x, y); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			var g []float64
			for _, p := range net.Parameters() {
				g = append(g, p.Grad.Float64s()...)
			}
			grads[r] = append(grads[r], g)
			for _, p := range net.Parameters() { // plain SGD, lr 0.1
				for i, v := range p.Grad.Float64s() {
					p.Value.Float64s()[i] -= 0.1 * v
				}
			}
		}
		return nil
	})
	return grads, nets
}

func TestAllReduceHookMatchesDefault(t *testing.T) {
	const world, steps = 2, 3
	want, _ := gradRun(t, world, steps, 5, nil)
	got, nets := gradRun(t, world, steps, 5, func(int, *comm.ProcessGroup) []ddp.Option {
		return []ddp.Option{ddp.WithCommHook[*comm.ProcessGroup](nil, ddp.AllReduceHook)}
	})
	for r := range world {
		for s := range steps {
			if !slices.Equal(got[r][s], want[r][s]) {
				t.Fatalf("rank %d step %d: AllReduceHook's gradients differ from the default reduction's (world 2 divides exactly)", r, s)
			}
		}
	}
	if nets[0].Stats().BytesSent == 0 {
		t.Error("no bytes counted")
	}
}

// TestCustomHookCalledPerBucket checks what a user's hook sees: every bucket
// once per step, in order, the last one flagged, the buffer holding this
// rank's undivided gradients with views into it; what it returns becomes
// the gradient.
func TestCustomHookCalledPerBucket(t *testing.T) {
	const world, steps = 2, 3
	type call struct {
		step, index int
		last        bool
	}
	var mu sync.Mutex
	calls := make([][]call, world)
	step := make([]int, world)
	type state struct{ rank int }
	hook := func(ctx context.Context, st *state, b *ddp.GradBucket) ddp.Future {
		mu.Lock()
		calls[st.rank] = append(calls[st.rank], call{step[st.rank], b.Index(), b.IsLast()})
		mu.Unlock()
		// the views are slices of the buffer, at the given offsets
		buf := b.Buffer().Float64s()
		for k, g := range b.Gradients() {
			off := b.Offsets()[k]
			if &g.Float64s()[0] != &buf[off] {
				return ddp.Failed(fmt.Errorf("gradient %d is not a view of the buffer", k))
			}
			if !g.Shape().Eq(b.Parameters()[k].Value.Shape()) {
				return ddp.Failed(fmt.Errorf("gradient %d has shape %v, its parameter %v", k, g.Shape(), b.Parameters()[k].Value.Shape()))
			}
		}
		// a hook of our own: sum, then halve in the continuation
		w := b.Group().AllReduce(ctx, b.Buffer(), comm.Sum)
		return ddp.Then(ddp.WorkFuture(w, b.Buffer()), func(_ context.Context, t *tensor.Dense) (*tensor.Dense, error) {
			out := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(t.Shape().TotalSize()))
			for i, v := range t.Float64s() {
				out.Float64s()[i] = v / 2
			}
			return out, nil
		})
	}
	want, _ := gradRun(t, world, steps, 4, nil)
	got, nets := gradRun(t, world, steps, 4, func(r int, _ *comm.ProcessGroup) []ddp.Option {
		return []ddp.Option{ddp.BucketCapMB(600.0 / (1 << 20)), ddp.Workers(1), ddp.WithCommHook(&state{r}, ddp.CommHook[*state](func(ctx context.Context, st *state, b *ddp.GradBucket) ddp.Future {
			f := hook(ctx, st, b)
			if b.IsLast() {
				mu.Lock()
				step[st.rank]++
				mu.Unlock()
			}
			return f
		}))}
	})
	nb := len(nets[0].Buckets())
	if nb < 2 {
		t.Fatalf("want several buckets, got %d", nb)
	}
	for r := range world {
		if len(calls[r]) != steps*nb {
			t.Fatalf("rank %d: %d hook calls, want %d (buckets %d, steps %d): %v", r, len(calls[r]), steps*nb, nb, steps, calls[r])
		}
		for i, c := range calls[r] {
			if c.step != i/nb || c.index != i%nb || c.last != (c.index == nb-1) {
				t.Fatalf("rank %d: call %d is %+v", r, i, c)
			}
		}
		for s := range steps {
			for i := range want[r][s] {
				if !relClose(got[r][s][i], want[r][s][i], 1e-14) {
					t.Fatalf("rank %d step %d: gradient %d is %v, the default gives %v", r, s, i, got[r][s][i], want[r][s][i])
				}
			}
		}
	}
}

func TestCompressionHooks(t *testing.T) {
	for _, c := range []struct {
		name string
		hook ddp.CommHook[*comm.ProcessGroup]
		tol  float64
	}{
		{"fp16", ddp.FP16CompressHook, 2e-3},
		{"bf16", ddp.BF16CompressHook, 2e-2},
	} {
		for _, world := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/world%d", c.name, world), func(t *testing.T) {
				const steps = 2
				want, plain := gradRun(t, world, steps, 6, nil)
				got, nets := gradRun(t, world, steps, 6, func(int, *comm.ProcessGroup) []ddp.Option {
					return []ddp.Option{ddp.WithCommHook[*comm.ProcessGroup](nil, c.hook), ddp.BucketCapMB(1000.0 / (1 << 20))}
				})
				for s := range steps {
					scale := 0.0
					for _, v := range want[0][s] {
						scale = math.Max(scale, math.Abs(v))
					}
					for r := range world {
						if !slices.Equal(got[r][s], got[0][s]) {
							t.Fatalf("step %d: rank %d's gradients differ from rank 0's", s, r)
						}
						for i := range want[r][s] {
							if d := math.Abs(got[r][s][i] - want[r][s][i]); d > c.tol*scale {
								t.Fatalf("rank %d step %d: gradient %d is %v, uncompressed %v", r, s, i, got[r][s][i], want[r][s][i])
							}
						}
					}
				}
				sent, full := nets[0].Stats().BytesSent, plain[0].Stats().BytesSent
				if sent*3 > full {
					t.Errorf("sent %d bytes, uncompressed %d: float64 in 16 bits should be about a quarter", sent, full)
				}
			})
		}
	}
}

// TestPowerSGDExactOnLowRankGradients uses batches of one row per rank: each
// rank's weight gradients are rank one, their average rank two, so a rank-2
// PowerSGD reproduces the plain average (up to rounding), error feedback and
// warm start included, while sending less.
func TestPowerSGDExactOnLowRankGradients(t *testing.T) {
	const world, steps, start = 2, 5, 2
	want, plain := gradRun(t, world, steps, 1, nil)
	states := make([]*ddp.PowerSGDState, world)
	got, nets := gradRun(t, world, steps, 1, func(r int, pg *comm.ProcessGroup) []ddp.Option {
		cfg := ddp.DefaultPowerSGDConfig()
		cfg.Rank, cfg.StartIter, cfg.Seed = 2, start, 7
		st, err := ddp.NewPowerSGDState(nil, cfg)
		if err != nil {
			t.Error(err)
		}
		states[r] = st
		return []ddp.Option{ddp.WithCommHook(st, ddp.PowerSGDHook)}
	})
	for r := range world {
		for s := range steps {
			for i := range want[r][s] {
				if !relClose(got[r][s][i], want[r][s][i], 1e-9) && math.Abs(got[r][s][i]-want[r][s][i]) > 1e-12 {
					t.Fatalf("rank %d step %d: gradient %d is %v, plain all-reduce %v", r, s, i, got[r][s][i], want[r][s][i])
				}
			}
		}
	}
	if it := states[0].Iter(); it != steps {
		t.Errorf("iterations counted %d, want %d", it, steps)
	}
	if cr := states[0].CompressionRate(); cr <= 1 {
		t.Errorf("compression rate %v", cr)
	}
	if nets[0].Stats().BytesSent >= plain[0].Stats().BytesSent {
		t.Errorf("PowerSGD sent %d bytes, plain %d", nets[0].Stats().BytesSent, plain[0].Stats().BytesSent)
	}
}

// TestPowerSGDRankOneApproximates checks that rank-1 PowerSGD on full-rank
// gradients keeps the replicas identical and trains (the loss falls).
func TestPowerSGDRankOneApproximates(t *testing.T) {
	const world, steps = 2, 8
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	params := make([][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		cfg := ddp.DefaultPowerSGDConfig()
		cfg.StartIter = 2
		st, err := ddp.NewPowerSGDState(pgs[r], cfg)
		if err != nil {
			return err
		}
		net, err := ddp.New(ctx, pgs[r], newMLP(t, hookSizes, 3), ddp.WithCommHook(st, ddp.PowerSGDHook))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 16, hookSizes[0], 3)
		var first, last float64
		for s := 0; s < steps; s++ {
			loss, err := net.Step(ctx, x, y)
			if err != nil {
				return err
			}
			if s == 0 {
				first = loss
			}
			last = loss
			for _, p := range net.Parameters() {
				for i, v := range p.Grad.Float64s() {
					p.Value.Float64s()[i] -= 0.2 * v
				}
			}
		}
		if !(last < first) {
			return fmt.Errorf("loss went from %v to %v", first, last)
		}
		for _, p := range net.Parameters() {
			params[r] = append(params[r], p.Value.Float64s()...)
		}
		return nil
	})
	if !slices.Equal(params[0], params[1]) {
		t.Error("the replicas drifted apart")
	}
}

// TestPowerSGDConfigChecked: settings out of range are refused, the zero
// config among them (its rank is 0), and compression from step 0 is
// allowed without error feedback and warm start.
func TestPowerSGDConfigChecked(t *testing.T) {
	with := func(f func(*ddp.PowerSGDConfig)) ddp.PowerSGDConfig {
		c := ddp.DefaultPowerSGDConfig()
		f(&c)
		return c
	}
	for name, cfg := range map[string]ddp.PowerSGDConfig{
		"start iteration 1 with error feedback": with(func(c *ddp.PowerSGDConfig) { c.StartIter = 1 }),
		"rank 0":                                with(func(c *ddp.PowerSGDConfig) { c.Rank = 0 }),
		"compression rate below 1":              with(func(c *ddp.PowerSGDConfig) { c.MinCompressionRate = 0.5 }),
		"negative epsilon":                      with(func(c *ddp.PowerSGDConfig) { c.Epsilon = -1 }),
		"negative start":                        with(func(c *ddp.PowerSGDConfig) { c.StartIter = -1 }),
		"zero config":                           {},
	} {
		if _, err := ddp.NewPowerSGDState(nil, cfg); !errors.Is(err, ddp.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	cfg := with(func(c *ddp.PowerSGDConfig) { c.StartIter, c.ErrorFeedback, c.WarmStart = 0, false, false })
	if _, err := ddp.NewPowerSGDState(nil, cfg); err != nil {
		t.Errorf("start at 0 without feedback or warm start: %v", err)
	}
}

// TestHookErrorFailsTheStep: a hook's failure is the step's error, and the
// group is aborted so no rank is left waiting.
func TestHookErrorFailsTheStep(t *testing.T) {
	const world = 2
	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	boom := errors.New("boom")
	errs := testkit.EachRank(world, func(r int) error {
		hook := func(ctx context.Context, _ int, b *ddp.GradBucket) ddp.Future {
			if r == 1 {
				return ddp.Failed(boom)
			}
			return ddp.AllReduceHook(ctx, nil, b)
		}
		net, err := ddp.New(ctx, pgs[r], newMLP(t, hookSizes, 1), ddp.WithCommHook(0, hook))
		if err != nil {
			return err
		}
		x, y := batch(1, 3, hookSizes[0], 3)
		_, err = net.Step(ctx, x, y)
		if err == nil {
			return nil
		}
		if _, again := net.Step(ctx, x, y); !errors.Is(again, ddp.ErrClosed) {
			return fmt.Errorf("step after a failed step: %v", again)
		}
		return err
	})
	if !errors.Is(errs[1], boom) {
		t.Errorf("rank 1: %v, want the hook's error", errs[1])
	}
	if !errors.Is(errs[0], comm.ErrPeerLost) {
		t.Errorf("rank 0: %v, want ErrPeerLost", errs[0])
	}
}
