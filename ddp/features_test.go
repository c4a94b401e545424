package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/models"
)

func flatGrads(ps []*models.Param) []float64 {
	var out []float64
	for _, p := range ps {
		if p.Grad == nil {
			out = append(out, make([]float64, p.Value.Shape().TotalSize())...)
			continue
		}
		out = append(out, p.Grad.Float64s()...)
	}
	return out
}

// TestNoSyncAccumulationEqualsOneBigBatch: three micro-batches, two inside
// NoSync, give the gradients of the concatenated batch (times three, the loss
// being a mean per micro-batch) with a single reduction.
func TestNoSyncAccumulationEqualsOneBigBatch(t *testing.T) {
	const world, micro, rowsPer = 2, 3, 4
	sizes := []int{5, 7, 3}
	pgs := localWorld(t, world)
	big := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	accum := make([][]float64, world)
	whole := make([][]float64, world)
	local := make([][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		x, y := batch(uint64(40+r), micro*rowsPer, sizes[0], sizes[2])
		net, err := ddp.New(ctx, pgs[r], newMLP(t, sizes, 1))
		if err != nil {
			return err
		}
		// a synchronized step first: NoSync must not add to its result
		if _, err := net.Step(ctx, rows(x, 0, rowsPer), rows(y, 0, rowsPer)); err != nil {
			return err
		}
		reduced := net.Stats().BucketsReduced
		err = net.NoSync(func() error {
			for k := 0; k < micro-1; k++ {
				if _, err := net.Step(ctx, rows(x, k*rowsPer, (k+1)*rowsPer), rows(y, k*rowsPer, (k+1)*rowsPer)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if net.Stats().BucketsReduced != reduced || net.Stats().NoSyncSteps != micro-1 {
			return fmt.Errorf("NoSync steps communicated: %+v", net.Stats())
		}
		local[r] = flatGrads(net.Parameters())
		if _, err := net.Step(ctx, rows(x, (micro-1)*rowsPer, micro*rowsPer), rows(y, (micro-1)*rowsPer, micro*rowsPer)); err != nil {
			return err
		}
		accum[r] = flatGrads(net.Parameters())

		ref, err := ddp.New(ctx, big[r], newMLP(t, sizes, 1))
		if err != nil {
			return err
		}
		if _, err := ref.Step(ctx, x, y); err != nil {
			return err
		}
		whole[r] = flatGrads(ref.Parameters())
		return nil
	})
	if slices.Equal(local[0], local[1]) {
		t.Error("inside NoSync the ranks' gradients should be their own")
	}
	for r := range world {
		for i := range whole[r] {
			if !relClose(accum[r][i]/micro, whole[r][i], 1e-12) {
				t.Fatalf("rank %d: gradient %d accumulated %v/%d, one big batch %v", r, i, accum[r][i], micro, whole[r][i])
			}
		}
	}
}

// heads is a model with a trunk and two heads: head A always, head B only
// where useB is set, so B's parameters may be unused on some ranks or all.
type heads struct {
	trunk, a, b *models.Linear
	useB        bool
}

func newHeads(t *testing.T, useB bool) *heads {
	rng := rand.New(rand.NewPCG(5, 5))
	mk := func(in, out int, name string) *models.Linear {
		l, err := models.NewLinear(in, out, models.WithRand(rng), models.WithDtype(tensor.Float64))
		if err != nil {
			t.Fatal(err)
		}
		l.Weight.Name, l.Bias.Name = name+".weight", name+".bias"
		return l
	}
	return &heads{trunk: mk(4, 6, "trunk"), a: mk(6, 3, "a"), b: mk(6, 3, "b"), useB: useB}
}

func (h *heads) Params() []*models.Param {
	return slices.Concat(h.trunk.Params(), h.a.Params(), h.b.Params())
}
func (h *heads) Buffers() []*models.Param { return nil }
func (h *heads) Forward(b *models.Builder, x *G.Node) (*G.Node, error) {
	z, err := h.trunk.Forward(b, x)
	if err != nil {
		return nil, err
	}
	out, err := h.a.Forward(b, z)
	if err != nil || !h.useB {
		return out, err
	}
	o2, err := h.b.Forward(b, z)
	if err != nil {
		return nil, err
	}
	return G.Add(out, o2)
}

func TestUnusedParameters(t *testing.T) {
	for _, static := range []bool{false, true} {
		t.Run(fmt.Sprintf("static=%v", static), func(t *testing.T) {
			opt := ddp.FindUnusedParameters(true)
			if static {
				opt = ddp.StaticGraph(true)
			}
			const world = 2
			t.Run("globally unused", func(t *testing.T) {
				pgs := localWorld(t, world)
				ctx := testCtx(t, 30*time.Second)
				testkit.RequireEachRank(t, world, func(r int) error {
					m := newHeads(t, false)
					net, err := ddp.New(ctx, pgs[r], m, opt, ddp.BucketCapMB(100.0/(1<<20)))
					if err != nil {
						return err
					}
					for s := 0; s < 3; s++ {
						x, y := batch(uint64(r+s), 3, 4, 3)
						if _, err := net.Step(ctx, x, y); err != nil {
							return err
						}
						if m.b.Weight.Grad != nil || m.b.Bias.Grad != nil {
							return fmt.Errorf("step %d: an unused head got a gradient", s)
						}
						if m.a.Weight.Grad == nil || m.trunk.Weight.Grad == nil {
							return fmt.Errorf("step %d: a used parameter has no gradient", s)
						}
					}
					return nil
				})
			})
			t.Run("used on one rank", func(t *testing.T) {
				pgs := localWorld(t, world)
				ref := localWorld(t, 1)
				ctx := testCtx(t, 30*time.Second)
				grads := make([][]float64, world)
				testkit.RequireEachRank(t, world, func(r int) error {
					net, err := ddp.New(ctx, pgs[r], newHeads(t, r == 0), opt)
					if err != nil {
						return err
					}
					x, y := batch(uint64(r), 3, 4, 3)
					if _, err := net.Step(ctx, x, y); err != nil {
						return err
					}
					grads[r] = flatGrads(net.Parameters())
					return nil
				})
				if !slices.Equal(grads[0], grads[1]) {
					t.Fatal("ranks disagree")
				}
				// rank 0's local gradient of head B, halved: rank 1 gave zero
				m := newHeads(t, true)
				one, err := ddp.New(ctx, ref[0], m)
				if err != nil {
					t.Fatal(err)
				}
				x, y := batch(0, 3, 4, 3)
				if _, err := one.Step(ctx, x, y); err != nil {
					t.Fatal(err)
				}
				off := 6*4 + 6 + 3*6 + 3
				for i, g := range slices.Concat(m.b.Weight.Grad.Float64s(), m.b.Bias.Grad.Float64s()) {
					if !relClose(grads[0][off+i], g/2, 1e-14) {
						t.Fatalf("head B gradient %d: %v, want %v", i, grads[0][off+i], g/2)
					}
				}
			})
		})
	}
	t.Run("refused without the option", func(t *testing.T) {
		const world = 2
		pgs := localWorld(t, world)
		ctx := testCtx(t, 30*time.Second)
		errs := testkit.EachRank(world, func(r int) error {
			net, err := ddp.New(ctx, pgs[r], newHeads(t, r == 0))
			if err != nil {
				return err
			}
			x, y := batch(uint64(r), 3, 4, 3)
			_, err = net.Step(ctx, x, y)
			return err
		})
		if !errors.Is(errs[1], ddp.ErrInvalidArgument) || !strings.Contains(errs[1].Error(), "FindUnusedParameters") || !strings.Contains(errs[1].Error(), "b.weight") {
			t.Errorf("rank 1: %v", errs[1])
		}
		if !errors.Is(errs[0], comm.ErrPeerLost) {
			t.Errorf("rank 0 should learn that rank 1 gave up: %v", errs[0])
		}
	})
}

// TestOverlapObservable proves that a bucket's all-reduce starts before the
// backward pass ends: when the comm hook receives the first bucket (the last
// layer's gradients), the first layer's gradient, which the backward pass
// computes last, is not there yet.
func TestOverlapObservable(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			const world = 2
			pgs := be.make(t, world)
			ctx := testCtx(t, 30*time.Second)
			sizes := []int{20, 30, 30, 4}
			testkit.RequireEachRank(t, world, func(r int) error {
				m := newMLP(t, sizes, 2)
				var firstLayerMissing []bool
				hook := func(ctx context.Context, _ struct{}, b *ddp.GradBucket) ddp.Future {
					if g := m.Params()[0].Grad; b.Index() == 0 && g != nil {
						missing := true
						for _, v := range g.Float64s() { // 0.weight's view, in the last bucket
							missing = missing && v == 0
						}
						firstLayerMissing = append(firstLayerMissing, missing)
					}
					return ddp.AllReduceHook(ctx, nil, b)
				}
				net, err := ddp.New(ctx, pgs[r], m, ddp.BucketCapMB(3000.0/(1<<20)), ddp.Workers(1), ddp.WithCommHook(struct{}{}, hook))
				if err != nil {
					return err
				}
				if len(net.Buckets()) < 2 {
					return fmt.Errorf("want several buckets: %v", net.Buckets())
				}
				// Grad views exist once the parameter had a gradient (after
				// the first step); they are zeroed after every step.
				x, y := batch(uint64(r), 6, sizes[0], 4)
				for s := 0; s < 3; s++ {
					if _, err := net.Step(ctx, x, y); err != nil {
						return err
					}
					for _, p := range net.Parameters() {
						for i := range p.Grad.Float64s() {
							p.Grad.Float64s()[i] = 0
						}
					}
				}
				if !slices.Equal(firstLayerMissing, []bool{true, true}) {
					return fmt.Errorf("first layer's gradient already computed when bucket 0 went out: %v", firstLayerMissing)
				}
				st := net.Stats()
				if st.BucketsOverlapped == 0 || st.BucketsOverlapped >= st.BucketsReduced {
					return fmt.Errorf("stats: %d of %d buckets started during backward", st.BucketsOverlapped, st.BucketsReduced)
				}
				if st.CommTime <= 0 || st.OverlappedTime < 0 || st.OverlappedTime > st.CommTime {
					return fmt.Errorf("stats times: %v", st)
				}
				return nil
			})
		})
	}
}

// TestJoinUnevenInputs gives rank r 2+r batches. Inside Join nobody hangs,
// and the result equals a simulation: at each step the ranks that still have
// data contribute their gradients, the others zeros, the sum divided by the
// world size; in the end every rank holds the model of the last rank to join.
// With the buckets in shared memory (SharedBuckets) as well: the joined
// ranks shadow the others' in-place all-reduces there, and their gradients
// stay as their last step made them.
func TestJoinUnevenInputs(t *testing.T) {
	testkit.CheckLeaks(t) // after the groups are closed
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) { testJoinUnevenInputs(t, shared) })
	}
}

func testJoinUnevenInputs(t *testing.T, shared bool) {
	const world = 3
	sizes := []int{5, 6, 3}
	const lr = 0.1
	nBatches := func(r int) int { return 2 + r }
	data := func(r, s int) (*tensor.Dense, *tensor.Dense) { return batch(uint64(10*r+s), 4, sizes[0], sizes[2]) }
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	finals := make([][]float64, world)
	shadows := make([]int64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		net, err := ddp.New(ctx, pgs[r], newMLP(t, sizes, uint64(r)), ddp.BucketCapMB(100.0/(1<<20)), ddp.SharedBuckets(shared))
		if err != nil {
			return err
		}
		var last []float64 // the gradients of the rank's last step
		err = net.Join(ctx, func() error {
			for s := 0; s < nBatches(r); s++ {
				x, y := data(r, s)
				if _, err := net.Step(ctx, x, y); err != nil {
					return err
				}
				for _, p := range net.Parameters() {
					for i, g := range p.Grad.Float64s() {
						p.Value.Float64s()[i] -= lr * g
					}
				}
			}
			last = flatGrads(net.Parameters())
			return nil
		})
		if err != nil {
			return err
		}
		if got := flatGrads(net.Parameters()); !slices.Equal(got, last) {
			return fmt.Errorf("rank %d: shadowing the others changed its gradients", r)
		}
		for _, p := range net.Parameters() {
			finals[r] = append(finals[r], p.Value.Float64s()...)
		}
		shadows[r] = net.Stats().ShadowSteps
		return nil
	})
	// simulate on one rank: the summed local gradients over 3
	one := localWorld(t, 1)
	sim := newMLP(t, sizes, 0)
	ref, err := ddp.New(ctx, one[0], sim)
	if err != nil {
		t.Fatal(err)
	}
	params := sim.Params()
	for s := 0; s < nBatches(world-1); s++ {
		sum := make([]float64, len(flatGrads(params)))
		for r := 0; r < world; r++ {
			if s >= nBatches(r) {
				continue
			}
			x, y := data(r, s)
			if _, err := ref.Step(ctx, x, y); err != nil {
				t.Fatal(err)
			}
			for i, g := range flatGrads(params) {
				sum[i] += g
			}
		}
		k := 0
		for _, p := range params {
			for i := range p.Value.Float64s() {
				p.Value.Float64s()[i] -= lr * (sum[k] / world)
				k++
			}
		}
	}
	var want []float64
	for _, p := range params {
		want = append(want, p.Value.Float64s()...)
	}
	for r := range world {
		for i := range want {
			if !relClose(finals[r][i], want[i], 1e-12) {
				t.Fatalf("rank %d: parameter %d is %v, simulation %v", r, i, finals[r][i], want[i])
			}
		}
	}
	for r := range world {
		if want := int64(nBatches(world-1) - nBatches(r)); shadows[r] != want {
			t.Errorf("rank %d shadowed %d steps, want %d", r, shadows[r], want)
		}
	}
}

// TestJoinDisagreementOnNoSync: inside Join the ranks learn about each
// other's NoSync state and fail together instead of mismatching.
func TestJoinDisagreementOnNoSync(t *testing.T) {
	const world = 2
	pgs := localWorld(t, world)
	ctx := testCtx(t, 30*time.Second)
	errs := testkit.EachRank(world, func(r int) error {
		net, err := ddp.New(ctx, pgs[r], newMLP(t, []int{3, 4, 2}, 1))
		if err != nil {
			return err
		}
		return net.Join(ctx, func() error {
			x, y := batch(uint64(r), 2, 3, 2)
			if r == 0 {
				return net.NoSync(func() error { _, err := net.Step(ctx, x, y); return err })
			}
			_, err := net.Step(ctx, x, y)
			return err
		})
	})
	for r, err := range errs {
		if !errors.Is(err, ddp.ErrMismatch) || !strings.Contains(err.Error(), "NoSync") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestJoinWithBuffers: a model with batch-norm buffers under Join, uneven
// inputs: the joined rank takes part in every buffer broadcast, nobody
// hangs, and the replicas end identical, buffers included.
func TestJoinWithBuffers(t *testing.T) {
	const world = 2
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	states := make([][]float64, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		m := bnNet(t)
		net, err := ddp.New(ctx, pgs[r], m)
		if err != nil {
			return err
		}
		err = net.Join(ctx, func() error {
			for s := 0; s < 1+2*r; s++ {
				x, y := imageBatch(uint64(10*r+s), 3)
				if _, err := net.Step(ctx, x, y); err != nil {
					return err
				}
				sgd(net.Parameters(), 0.1)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, p := range models.StateDict(m) {
			states[r] = append(states[r], asFloats(p.Value)...)
		}
		return nil
	})
	if !slices.Equal(states[0], states[1]) {
		t.Error("replicas differ after Join")
	}
}

// TestCancelledStepAbortsTheGroup: a rank whose step is cancelled fails
// with ErrTimeout, and the other rank, waiting in the same step, fails with
// ErrPeerLost (had it waited for its own 30 s deadline, it would report
// ErrTimeout).
func TestCancelledStepAbortsTheGroup(t *testing.T) {
	const world = 2
	pgs := localWorld(t, world)
	ctx := testCtx(t, 60*time.Second)
	errs := testkit.EachRank(world, func(r int) error {
		net, err := ddp.New(ctx, pgs[r], newMLP(t, hookSizes, 1))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 3, hookSizes[0], 3)
		sctx := ctx
		if r == 1 {
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			sctx = c
			<-c.Done() // expired before the step starts its collectives
		}
		_, err = net.Step(sctx, x, y)
		return err
	})
	if !errors.Is(errs[1], comm.ErrTimeout) {
		t.Errorf("rank 1: %v, want ErrTimeout", errs[1])
	}
	if !errors.Is(errs[0], comm.ErrPeerLost) {
		t.Errorf("rank 0: %v, want ErrPeerLost", errs[0])
	}
}
