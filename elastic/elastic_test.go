package elastic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/internal/testkit"
)

// fastConfig: the test job's timings.
func fastConfig() elastic.Config {
	return elastic.Config{Job: "test", MinSize: 2, LastCall: 300 * time.Millisecond, JoinTimeout: 20 * time.Second,
		PeerTimeout: time.Second}
}

// runMembers trains the members concurrently and returns their errors.
func runMembers(ctx context.Context, steps int64, mbs ...*member) []error {
	return testkit.EachRank(len(mbs), func(i int) error { return mbs[i].train(ctx, steps) })
}

func tcpStore(t *testing.T) store.Store { return dialStore(t, serveStore(t)) }

func TestFixedMembershipMatchesReference(t *testing.T) {
	const steps = 16
	want := reference(t, steps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := tcpStore(t)
	cfg := fastConfig()
	cfg.MinSize, cfg.MaxSize = 3, 3
	mbs := []*member{newMember(t, ctx, st, "a", 1, cfg), newMember(t, ctx, st, "b", 1, cfg), newMember(t, ctx, st, "c", 1, cfg)}
	for i, err := range runMembers(ctx, steps, mbs...) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	for _, mb := range mbs {
		defer mb.m.Close()
		if d := maxDiff(mb.params(), want); d > 1e-9 {
			t.Errorf("%s differs from the single-process run by %g", mb.id, d)
		}
		if ev := mb.m.Events(); len(ev) != 1 || ev[0].Size != 3 {
			t.Errorf("%s: rounds %+v, want one of size 3", mb.id, ev)
		}
	}
}

func TestMemberLostMidStep(t *testing.T) {
	const steps, dieAt = 24, 8
	want := reference(t, steps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := tcpStore(t)
	cfg := fastConfig()
	cfg.MaxSize = 3
	mbs := []*member{newMember(t, ctx, st, "a", 1, cfg), newMember(t, ctx, st, "b", 1, cfg), newMember(t, ctx, st, "c", 1, cfg)}
	var died time.Time
	mbs[2].beforeStep = func(step int64) error {
		if step == dieAt {
			// Gone in the middle of the job: its peers are in the
			// step's collectives or about to be.
			died = time.Now()
			mbs[2].m.Close()
			return errDied
		}
		return nil
	}
	// The first round must hold all three.
	cfg.MinSize = 3
	errs := runMembers(ctx, steps, mbs...)
	if errs[2] != errDied {
		t.Fatalf("the dying member: %v", errs[2])
	}
	for i, err := range errs[:2] {
		if err != nil {
			t.Fatalf("survivor %d: %v", i, err)
		}
	}
	for _, mb := range mbs[:2] {
		defer mb.m.Close()
		if d := maxDiff(mb.params(), want); d > 1e-9 {
			t.Errorf("%s differs from the single-process run by %g", mb.id, d)
		}
		ev := mb.m.Events()
		last := ev[len(ev)-1]
		if last.Size != 2 || last.Step != dieAt {
			t.Errorf("%s: last round %+v, want size 2 from step %d", mb.id, last, dieAt)
		}
		if took := last.Resumed.Sub(died); took > 3*time.Second {
			t.Errorf("%s resumed %v after the death, want within 3s", mb.id, took)
		}
		t.Logf("%s: detected after %v, resumed after %v", mb.id, last.Detected.Sub(died), last.Resumed.Sub(died))
	}
}

func TestMemberJoinsAndIsHealed(t *testing.T) {
	const steps, joinAt = 24, 8
	want := reference(t, steps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := tcpStore(t)
	cfg := fastConfig()
	a, b := newMember(t, ctx, st, "a", 1, cfg), newMember(t, ctx, st, "b", 1, cfg)
	joined := make(chan struct{})
	var once sync.Once
	a.afterCommit = func(step int64) {
		if step == joinAt {
			once.Do(func() { close(joined) })
		}
		// Slow enough for the newcomer to arrive mid-run.
		time.Sleep(20 * time.Millisecond)
	}
	var c *member
	var started, firstCommit time.Time
	var cErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		<-joined
		started = time.Now()
		// Its own initial weights: only healing makes it equal.
		c = newMember(t, ctx, st, "c", 99, cfg)
		c.afterCommit = func(int64) {
			if firstCommit.IsZero() {
				firstCommit = time.Now()
			}
		}
		cErr = c.train(ctx, steps)
	})
	errs := runMembers(ctx, steps, a, b)
	wg.Wait()
	for i, err := range append(errs, cErr) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	for _, mb := range []*member{a, b, c} {
		defer mb.m.Close()
		if d := maxDiff(mb.params(), want); d > 1e-9 {
			t.Errorf("%s differs from the single-process run by %g", mb.id, d)
		}
	}
	ev := c.m.Events()
	if len(ev) != 1 || !ev[0].Healed || ev[0].Size != 3 || ev[0].Step < joinAt {
		t.Errorf("newcomer's rounds %+v, want one of size 3, healed, from step >= %d", ev, joinAt)
	}
	if took := firstCommit.Sub(started); took > 5*time.Second || firstCommit.IsZero() {
		t.Errorf("newcomer trained %v after it started, want within 5s", took)
	}
	t.Logf("newcomer healed at step %d and committed its first step %v after starting", ev[0].Step, firstCommit.Sub(started))
}

// TestMemberLeftBehindRejoins drops one member out of its round and keeps it
// away long enough for the others to form a round without it (as a link
// that is cut and comes back, or a SIGSTOP and SIGCONT, would): when it
// returns, its round is gone, and it must rejoin the running job and be
// healed rather than wait alone for a round nobody else joins.
func TestMemberLeftBehindRejoins(t *testing.T) {
	const steps, stallAt = 200, 10
	const stall = 2500 * time.Millisecond
	want := reference(t, steps)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := tcpStore(t)
	cfg := fastConfig()
	cfg.MaxSize = 3
	cfg.JoinTimeout = 10 * time.Second
	mbs := []*member{newMember(t, ctx, st, "a", 1, cfg), newMember(t, ctx, st, "b", 1, cfg), newMember(t, ctx, st, "c", 1, cfg)}
	mbs[0].afterCommit = func(int64) { time.Sleep(15 * time.Millisecond) }
	var woke time.Time
	mbs[2].beforeStep = func(step int64) error {
		if step == stallAt && woke.IsZero() {
			// Its peers see it gone at once; it sees its step fail
			// only after the stall.
			mbs[2].round.Group.Abort(nil)
			time.Sleep(stall)
			woke = time.Now()
		}
		return nil
	}
	for i, err := range runMembers(ctx, steps, mbs...) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	for _, mb := range mbs {
		defer mb.m.Close()
		if d := maxDiff(mb.params(), want); d > 1e-9 {
			t.Errorf("%s differs from the single-process run by %g", mb.id, d)
		}
	}
	var back *elastic.Event
	for _, ev := range mbs[2].m.Events() {
		if ev.Resumed.After(woke) {
			back = &ev
			break
		}
	}
	if back == nil || back.Size != 3 || !back.Healed {
		t.Fatalf("c: no healed round of 3 after it woke: %+v", mbs[2].m.Events())
	}
	t.Logf("c: back in round %d (size 3, healed at step %d) %v after it woke", back.Round, back.Step, back.Resumed.Sub(woke))
	for _, mb := range mbs[:2] {
		ev := mb.m.Events()
		if last := ev[len(ev)-1]; last.Round != back.Round || len(ev) < 3 || ev[1].Size != 2 {
			t.Errorf("%s: rounds %+v, want one of 2 without c, then c's round %d", mb.id, ev, back.Round)
		}
	}
}
