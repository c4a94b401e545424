package elastic_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/elastic"
	"github.com/tandemml/tandem/internal/netns"
	"github.com/tandemml/tandem/internal/testlog"
)

// netJob is a job whose members run on separate hosts (network namespaces
// joined by a bridge) and meet at a store served in the root namespace.
type netJob struct {
	net  *netns.Net
	addr string      // the store, at the bridge's address
	st   store.Store // the test's own client of it
	ref  []float64   // the undisturbed run's final parameters
	ps   []*memberProc
	slow string // while this file exists, the members slow down
	gate string // the members join once this file exists
}

func newNetJob(t *testing.T, hosts int, ref []float64) *netJob {
	t.Helper()
	nt := netns.New(t, hosts)
	addr := serveStoreAt(t, net.JoinHostPort(nt.RootAddr(), "0"))
	st := dialStore(t, addr)
	j := &netJob{net: nt, addr: addr, st: st, ref: ref, slow: filepath.Join(t.TempDir(), "slow"), gate: filepath.Join(t.TempDir(), "go")}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range j.ps {
				t.Logf("log of member %s:\n%s", filepath.Base(p.out), p.logs)
			}
		}
	})
	return j
}

// start runs a member in h. pause is its sleep after each commit; seed
// draws its initial weights (1 is the reference's).
func (j *netJob) start(t *testing.T, h *netns.Host, id string, steps int64, pause time.Duration, seed uint64) *memberProc {
	t.Helper()
	out := filepath.Join(t.TempDir(), id+".json")
	// Bounds the member's life; runMember's cleanup kills it sooner.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := h.Command(ctx, os.Args[0], "-test.run=^TestHelperMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), memberSpec(j.addr, id, steps, out, pause, seed, j.slow, j.gate))
	logs := &testlog.Buffer{}
	cmd.Stderr = logs
	p := runMember(t, cmd, out, logs)
	j.ps = append(j.ps, p)
	return p
}

// startAll runs members ids on the first hosts, waits until every one has
// started, and lets them join together.
func (j *netJob) startAll(t *testing.T, ids []string, steps int64, pause time.Duration) []*memberProc {
	t.Helper()
	var ps []*memberProc
	for i, id := range ids {
		ps = append(ps, j.start(t, j.net.Host(i), id, steps, pause, 1))
	}
	deadline := time.After(30 * time.Second)
	for i, p := range ps {
		select {
		case <-p.ready:
		case <-p.exited:
			t.Fatalf("member %s exited before it was ready%s", ids[i], p.logTail())
		case <-deadline:
			t.Fatalf("member %s not started within 30s%s", ids[i], p.logTail())
		}
	}
	if err := os.WriteFile(j.gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return ps
}

// holdBack slows the members down (slowPause more per step) until release,
// so that the job is still running when a member it lost comes back.
func (j *netJob) holdBack(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(j.slow, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (j *netJob) release(t *testing.T) {
	t.Helper()
	if err := os.Remove(j.slow); err != nil {
		t.Fatal(err)
	}
}

// round reads the members of round q in rank order.
func (j *netJob) round(ctx context.Context, q int) ([]string, error) {
	b, err := j.st.Get(ctx, "elastic/test/r/"+strconv.Itoa(q)+"/result")
	if err != nil {
		return nil, err
	}
	var res struct{ Members []struct{ ID string } }
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	var ids []string
	for _, m := range res.Members {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

// latest returns the newest round and its members in rank order.
func (j *netJob) latest(t *testing.T) (int, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := j.st.Add(ctx, "elastic/test/latest", 0)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := j.round(ctx, int(q))
	if err != nil {
		t.Fatal(err)
	}
	return int(q), ids
}

// waitRound waits at most limit for the job to form a round after round
// after whose members are ids (in any order), and returns its number.
func (j *netJob) waitRound(t *testing.T, after int, ids []string, limit time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	want := slices.Sorted(slices.Values(ids))
	for q := after + 1; ; {
		latest, err := j.st.Add(ctx, "elastic/test/latest", 0)
		for ; err == nil && q <= int(latest); q++ {
			var got []string
			if got, err = j.round(ctx, q); err != nil {
				break
			}
			if slices.Sort(got); slices.Equal(got, want) {
				return q
			}
		}
		if err != nil {
			t.Fatalf("no round of %v after round %d within %v: %v", ids, after, limit, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no round of %v after round %d within %v", ids, after, limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkAddrs checks that the members of round q advertised their host's
// address first, so that peers on other hosts reach them.
func (j *netJob) checkAddrs(t *testing.T, q int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hosts := map[string]bool{}
	for _, h := range j.net.Hosts() {
		hosts[h.Addr()] = true
	}
	var seen []string
	defer func() { t.Logf("round %d's members advertise %v", q, seen) }()
	for rank := 0; ; rank++ {
		key := "elastic/test/r/" + strconv.Itoa(q) + "/pg/tandem/tcp/addr/" + strconv.Itoa(rank)
		ok, err := j.st.Check(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if rank == 0 {
				t.Fatalf("round %d left no addresses in the store (%s)", q, key)
			}
			return
		}
		v, err := j.st.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, string(v))
		first, _, _ := strings.Cut(string(v), ",")
		host, _, err := net.SplitHostPort(first)
		if err != nil || !hosts[host] {
			t.Errorf("round %d rank %d advertises %q: the first address is not its host's (hosts %v)", q, rank, v, hosts)
		}
	}
}

// finish waits for members ps to end and checks that each ends with the
// undisturbed run's model; it returns their reports.
func (j *netJob) finish(t *testing.T, limit time.Duration, ps ...*memberProc) []childReport {
	t.Helper()
	deadline := time.Now().Add(limit)
	rs := make([]childReport, len(ps))
	for i, p := range ps {
		rs[i] = p.reportWithin(t, max(time.Until(deadline), time.Millisecond))
		if d := maxDiff(rs[i].Params, j.ref); d > 1e-9 {
			t.Errorf("member %s differs from the undisturbed run by %g", filepath.Base(p.out), d)
		}
	}
	return rs
}

// after returns the first round a member formed after t0, or nil.
func after(r childReport, t0 time.Time) *elastic.Event {
	for i := range r.Events {
		if r.Events[i].Resumed.After(t0) {
			return &r.Events[i]
		}
	}
	return nil
}

// resumed checks that a member formed a round of size after the fault at
// hit, from a step at least from, within 3 s, and logs the times.
func resumed(t *testing.T, who string, r childReport, hit time.Time, size int, from int64) *elastic.Event {
	t.Helper()
	ev := after(r, hit)
	if ev == nil {
		t.Errorf("%s: no round after the fault: %+v", who, r.Events)
		return nil
	}
	if ev.Size != size || ev.Step < from {
		t.Errorf("%s: round after the fault %+v, want size %d from step >= %d", who, *ev, size, from)
	}
	took := ev.Resumed.Sub(hit)
	if took > 3*time.Second {
		t.Errorf("%s resumed %v after the fault, want within 3s", who, took)
	}
	t.Logf("%s: detected after %v, resumed after %v at step %d in round %d of size %d", who,
		ev.Detected.Sub(hit).Round(time.Millisecond), took.Round(time.Millisecond), ev.Step, ev.Round, ev.Size)
	return ev
}

// TestNetnsFaults runs member processes on separate hosts (network
// namespaces) and hurts one mid-run: a kill, a stop, a link cut long enough
// to lose it and one short enough to ride out, a slow lossy link, and a
// node that arrives. Every survivor must resume within 3 s, no committed
// step may be lost, and every member that finishes must end with the model
// of an undisturbed run.
func TestNetnsFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes in network namespaces")
	}
	refs := map[int64][]float64{}
	ref := func(steps int64) []float64 {
		if refs[steps] == nil {
			refs[steps] = reference(t, steps)
		}
		return refs[steps]
	}
	ids := []string{"a", "b", "c"}

	// A member killed or stopped in the middle of a step: the kill hits
	// the round's rank 0 (the member that heals the others), the stop its
	// last rank.
	for _, fault := range []struct {
		name string
		sig  syscall.Signal
		rank func(size int) int
	}{
		{"kill -9 of rank 0 mid-step", syscall.SIGKILL, func(int) int { return 0 }},
		{"SIGSTOP of the last rank mid-step", syscall.SIGSTOP, func(n int) int { return n - 1 }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			const steps, hitAt = 40, 10
			j := newNetJob(t, 3, ref(steps))
			ps := j.startAll(t, ids, steps, 15*time.Millisecond)
			// A member that starts late joins at a later round.
			q := j.waitRound(t, 0, ids, 20*time.Second)
			_, members := j.latest(t)
			victim := slices.Index(ids, members[fault.rank(len(members))])
			ps[victim].waitStepWithin(t, hitAt, 20*time.Second)
			if now, _ := j.latest(t); now != q {
				t.Fatalf("round %d formed while nothing failed (after round %d of all three)", now, q)
			}
			j.checkAddrs(t, q)
			time.Sleep(5 * time.Millisecond) // into the next step
			hit := time.Now()
			if err := ps[victim].cmd.Process.Signal(fault.sig); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s, rank %d of round %d", fault.sig, ids[victim], fault.rank(len(members)), q)
			var live []*memberProc
			var names []string
			for i, p := range ps {
				if i != victim {
					live, names = append(live, p), append(names, ids[i])
				}
			}
			rs := j.finish(t, 20*time.Second, live...)
			for i, r := range rs {
				resumed(t, names[i], r, hit, 2, hitAt)
			}
		})
	}

	// The link of one host down for 5 s: the others go on without it; it
	// comes back to find its round gone, rejoins and is healed.
	t.Run("link down 5s", func(t *testing.T) {
		// Held back, the job runs fewer than 7 steps a second: the lost
		// member is back long before the others could finish.
		const steps, hitAt = 90, 10
		const cut = 5 * time.Second
		j := newNetJob(t, 3, ref(steps))
		ps := j.startAll(t, ids, steps, 15*time.Millisecond)
		q := j.waitRound(t, 0, ids, 20*time.Second)
		ps[2].waitStepWithin(t, hitAt, 20*time.Second)
		if now, _ := j.latest(t); now != q {
			t.Fatalf("round %d formed while nothing failed (after round %d of all three)", now, q)
		}
		j.holdBack(t)
		time.Sleep(5 * time.Millisecond)
		hit := time.Now()
		if err := j.net.Host(2).CutFor(cut); err != nil {
			t.Fatal(err)
		}
		// Back in a round of three: then the job may go at full speed.
		j.waitRound(t, q, ids, cut+5*time.Second)
		j.release(t)
		rs := j.finish(t, 20*time.Second, ps...)
		var lost *elastic.Event
		for i, r := range rs[:2] {
			lost = resumed(t, ids[i], r, hit, 2, hitAt)
		}
		if lost == nil {
			return
		}
		// The cut member rejoins: the survivors and it form a round of
		// three in which it is healed.
		back := hit.Add(cut)
		ev := after(rs[2], back)
		if ev == nil || ev.Size != 3 || !ev.Healed {
			t.Fatalf("c: no healed round of 3 after its link came back: %+v", rs[2].Events)
		}
		t.Logf("c: rejoined and healed %v after its link came back, at step %d in round %d", ev.Resumed.Sub(back).Round(time.Millisecond), ev.Step, ev.Round)
		for i, r := range rs[:2] {
			if e := after(r, back); e == nil || e.Round != ev.Round {
				t.Errorf("%s: not in c's round %d after the link came back: %+v", ids[i], ev.Round, r.Events)
			}
		}
	})

	// The link of one host down for 0.5 s: TCP may ride it out (no new
	// round), or the members reconfigure; either way all three go on.
	t.Run("link down 0.5s", func(t *testing.T) {
		const steps, hitAt = 60, 10
		j := newNetJob(t, 3, ref(steps))
		ps := j.startAll(t, ids, steps, 15*time.Millisecond)
		q := j.waitRound(t, 0, ids, 20*time.Second)
		ps[2].waitStepWithin(t, hitAt, 20*time.Second)
		if now, _ := j.latest(t); now != q {
			t.Fatalf("round %d formed while nothing failed (after round %d of all three)", now, q)
		}
		j.holdBack(t)
		time.Sleep(5 * time.Millisecond)
		hit := time.Now()
		if err := j.net.Host(2).CutFor(500 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		// Time for the members to notice the cut, and to bring the cut
		// one back if they went on without it.
		time.Sleep(4 * time.Second)
		j.release(t)
		rs := j.finish(t, 20*time.Second, ps...)
		var changed []string
		for i, r := range rs {
			if after(r, hit) != nil {
				changed = append(changed, ids[i])
			}
		}
		if len(changed) == 0 {
			t.Logf("no reconfiguration: the connections rode out the cut")
			return
		}
		t.Logf("members %v reconfigured", changed)
		for i, r := range rs {
			ev := after(r, hit)
			if ev == nil {
				t.Errorf("%s: no round after the cut while %v formed one: %+v", ids[i], changed, r.Events)
				continue
			}
			took := ev.Resumed.Sub(hit)
			if took > 3*time.Second {
				t.Errorf("%s resumed %v after the cut, want within 3s", ids[i], took)
			}
			t.Logf("%s: detected after %v, resumed after %v at step %d in round %d of size %d", ids[i],
				ev.Detected.Sub(hit).Round(time.Millisecond), took.Round(time.Millisecond), ev.Step, ev.Round, ev.Size)
		}
	})

	// Delay and loss on one host's link, from the start: the job trains
	// through it.
	t.Run("netem 20ms 1% loss", func(t *testing.T) {
		if !netns.NetemAvailable() {
			t.Skip("this kernel has no netem qdisc (sch_netem), so delay and loss cannot be added; see internal/netns")
		}
		const steps = 40
		j := newNetJob(t, 3, ref(steps))
		if err := j.net.Host(2).Netem(20*time.Millisecond, 1); err != nil {
			t.Fatal(err)
		}
		ps := j.startAll(t, ids, steps, 15*time.Millisecond)
		start := time.Now()
		rs := j.finish(t, 40*time.Second, ps...)
		for i, r := range rs {
			t.Logf("%s: %d round(s) over %v: %+v", ids[i], len(r.Events), time.Since(start).Round(time.Millisecond), r.Events)
		}
	})

	// A node added mid-run: a fresh member on a new host is healed from a
	// peer and trains within 5 s of its start.
	t.Run("node added", func(t *testing.T) {
		const steps, joinAt = 80, 10
		j := newNetJob(t, 2, ref(steps))
		ps := j.startAll(t, ids[:2], steps, 20*time.Millisecond)
		ps[0].waitStepWithin(t, joinAt, 20*time.Second)
		// Held back until the newcomer trains, the job is still running
		// when it arrives, however slowly this machine starts it.
		j.holdBack(t)
		h := j.net.AddHost(t)
		// Its own initial weights: only healing makes it equal.
		c := j.start(t, h, "c", steps, 20*time.Millisecond, 99)
		c.waitStepWithin(t, 1, 10*time.Second)
		j.release(t)
		took := c.first.Sub(c.started)
		if took > 5*time.Second {
			t.Errorf("the newcomer committed its first step %v after it started, want within 5s", took)
		}
		rs := j.finish(t, 20*time.Second, append(ps, c)...)
		ev := rs[2].Events
		if len(ev) != 1 || !ev[0].Healed || ev[0].Size != 3 || ev[0].Step < joinAt {
			t.Errorf("newcomer's rounds %+v, want one of size 3, healed, from step >= %d", ev, joinAt)
		} else {
			t.Logf("newcomer: healed at step %d in round %d %v after it started; first commit %v after it started",
				ev[0].Step, ev[0].Round, ev[0].Resumed.Sub(c.started).Round(time.Millisecond), took.Round(time.Millisecond))
			j.checkAddrs(t, ev[0].Round)
		}
		for i, r := range rs[:2] {
			if !slices.ContainsFunc(r.Events, func(e elastic.Event) bool { return e.Size == 3 }) {
				t.Errorf("%s: never in a round of 3: %+v", ids[i], r.Events)
			}
		}
	})
}
