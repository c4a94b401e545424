package elastic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/ddp"
)

// TestDDPElasticLoop trains through ddp.Elastic, the packaged form of the
// loop: three members, one lost mid-run and a newcomer after it; every
// member that trains to the end holds the undisturbed run's model.
func TestDDPElasticLoop(t *testing.T) {
	const steps, dieAt, joinAt = 24, 6, 12
	want := reference(t, steps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := tcpStore(t)
	cfg := fastConfig()
	cfg.MaxSize = 3
	mbs := []*member{newMember(t, ctx, st, "a", 1, cfg), newMember(t, ctx, st, "b", 1, cfg), newMember(t, ctx, st, "c", 1, cfg)}
	run := func(mb *member, stopAt int64, onStep func(int64)) error {
		net := ddp.NewElastic(mb.m, mb.stream, mb.model, mb.opt)
		batch := func(ctx context.Context, idx []int) (x, y *tensor.Dense, err error) {
			b, err := mb.loader.Batch(ctx, idx)
			if err != nil {
				return nil, nil, err
			}
			return b.X, b.Y, nil
		}
		for mb.m.Progress().Step < steps {
			if mb.m.Progress().Step == stopAt {
				mb.m.Close()
				return errDied
			}
			if _, _, err := net.Step(ctx, batch); err != nil {
				return err
			}
			if onStep != nil {
				onStep(mb.m.Progress().Step)
			}
		}
		return nil
	}
	joined := make(chan struct{})
	var once sync.Once
	var newcomer *member
	var newErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		<-joined
		newcomer = newMember(t, ctx, st, "d", 42, cfg)
		newErr = run(newcomer, -1, nil)
	})
	errs := make([]error, 3)
	for i, mb := range mbs {
		stopAt := int64(-1)
		if i == 2 {
			stopAt = dieAt
		}
		wg.Go(func() {
			errs[i] = run(mb, stopAt, func(step int64) {
				if step >= joinAt {
					once.Do(func() { close(joined) })
				}
				time.Sleep(10 * time.Millisecond)
			})
		})
	}
	wg.Wait()
	if errs[2] != errDied || errs[0] != nil || errs[1] != nil || newErr != nil {
		t.Fatalf("members: %v, newcomer: %v", errs, newErr)
	}
	for _, mb := range []*member{mbs[0], mbs[1], newcomer} {
		defer mb.m.Close()
		if d := maxDiff(mb.params(), want); d > 1e-9 {
			t.Errorf("%s differs from the undisturbed run by %g", mb.id, d)
		}
	}
	sizes := []int{}
	for _, ev := range mbs[0].m.Events() {
		sizes = append(sizes, ev.Size)
	}
	if len(sizes) < 3 || sizes[0] != 3 || sizes[1] != 2 || sizes[len(sizes)-1] != 3 {
		t.Errorf("member a's rounds had sizes %v, want 3, 2, ..., 3", sizes)
	}
}
