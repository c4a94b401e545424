package launch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// The rendezvous tests run goroutine agents, each with its own client of a
// real TCP store server on loopback, with short heartbeats so that each
// test takes a second or two.

const rdzvToken = "rendezvous-test-token"

// rdzvServer serves a TCP store on loopback until the test ends.
func rdzvServer(t *testing.T) string {
	t.Helper()
	srv, err := store.NewServer("127.0.0.1:0", store.WithToken(rdzvToken))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("store server: %v", err)
		}
	})
	return srv.Addr()
}

// fastConfig is a configuration with short timings for node id of run.
func fastConfig(run, id string, min, max int) launch.RendezvousConfig {
	return launch.RendezvousConfig{
		RunID: run, NodeID: id, MinNodes: min, MaxNodes: max, MaxRestarts: 5,
		JoinTimeout: 10 * time.Second, LastCall: 400 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond, LostAfter: 400 * time.Millisecond, Poll: 10 * time.Millisecond,
	}
}

// agent dials the store at addr and returns a Rendezvous for cfg, closed
// with its client when the test ends.
func agent(t *testing.T, addr string, cfg launch.RendezvousConfig) *launch.Rendezvous {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := store.Dial(ctx, addr, store.WithToken(rdzvToken), store.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r, err := launch.NewRendezvous(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		c.Close()
	})
	return r
}

// joined is one agent's Join result.
type joined struct {
	id    string
	round launch.Round
	err   error
	took  time.Duration
}

// joinAll runs Join on every agent at once and returns the results by node id.
func joinAll(ctx context.Context, agents map[string]*launch.Rendezvous) map[string]joined {
	var mu sync.Mutex
	out := map[string]joined{}
	var wg sync.WaitGroup
	for id, a := range agents {
		wg.Go(func() {
			start := time.Now()
			r, err := a.Join(ctx)
			mu.Lock()
			out[id] = joined{id, r, err, time.Since(start)}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// checkRound checks that every result is the same round number n with the
// members want (in any order), each node at its own index.
func checkRound(t *testing.T, res map[string]joined, n int, want ...string) {
	t.Helper()
	var nodes []string
	for id, j := range res {
		if j.err != nil {
			t.Fatalf("node %s: Join: %v", id, j.err)
		}
		if j.round.Number != n {
			t.Fatalf("node %s joined round %d, want %d", id, j.round.Number, n)
		}
		if nodes == nil {
			nodes = j.round.Nodes
		}
		if !slices.Equal(nodes, j.round.Nodes) {
			t.Fatalf("nodes disagree on the members: %v and %v", nodes, j.round.Nodes)
		}
		if j.round.NodeRank < 0 || nodes[j.round.NodeRank] != id {
			t.Fatalf("node %s got node rank %d in %v", id, j.round.NodeRank, nodes)
		}
		if j.round.StorePrefix != launch.StorePrefix("run", n) && !strings.HasSuffix(j.round.StorePrefix, fmt.Sprintf("/round/%d", n)) {
			t.Fatalf("node %s: store prefix %q", id, j.round.StorePrefix)
		}
	}
	got := slices.Sorted(slices.Values(nodes))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("round %d has nodes %v, want %v", n, got, want)
	}
}

func TestRendezvousFormsAtMinAfterLastCall(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b"} {
		agents[id] = agent(t, addr, fastConfig("run", id, 2, 3))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b")
	for id, j := range res {
		// Two of at most three: the round waits out the last call for a third.
		if j.took < 400*time.Millisecond {
			t.Errorf("node %s: the round formed after %v, before the last call (400ms) was over", id, j.took)
		}
	}
}

func TestRendezvousClosesAtOnceAtMax(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b", "c"} {
		cfg := fastConfig("run", id, 2, 3)
		cfg.LastCall = time.Minute // never reached: three is the most
		agents[id] = agent(t, addr, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b", "c")
	for id, j := range res {
		if j.took > 5*time.Second {
			t.Errorf("node %s: a full round took %v to form", id, j.took)
		}
	}
}

// A node whose heartbeat stops is lost: the others open a new round
// without it, count the restart, and it forms at once (every other member
// of the last round is there).
func TestRendezvousLostHeartbeatStartsRound(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b", "c"} {
		agents[id] = agent(t, addr, fastConfig("run", id, 2, 3))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b", "c")

	agents["c"].Close() // its heartbeat stops
	lostAt := time.Now()
	delete(agents, "c")
	var wg sync.WaitGroup
	changes := map[string]launch.Change{}
	var mu sync.Mutex
	for id, a := range agents {
		wg.Go(func() {
			ch, err := a.Watch(ctx, res[id].round)
			if err != nil {
				t.Errorf("node %s: Watch: %v", id, err)
			}
			mu.Lock()
			changes[id] = ch
			mu.Unlock()
		})
	}
	wg.Wait()
	for id, ch := range changes {
		if ch.Done || ch.Next != 1 || ch.Reason != "node c lost: no heartbeat for 400ms" {
			t.Errorf("node %s: Watch returned %+v, want round 1 for the loss of node c", id, ch)
		}
	}
	// LostAfter counts from the last beat the others saw, up to a
	// heartbeat interval before Close.
	if d := time.Since(lostAt); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("the loss was noticed after %v, want about 400ms", d)
	}
	start := time.Now()
	res = joinAll(ctx, agents)
	checkRound(t, res, 1, "a", "b")
	if res["a"].round.Reason != "node c lost: no heartbeat for 400ms" {
		t.Errorf("round 1's reason: %q", res["a"].round.Reason)
	}
	// Every member of round 0 but the lost one is back: no last call.
	if d := time.Since(start); d >= 400*time.Millisecond {
		t.Errorf("round 1 took %v to form; every live member was there at once", d)
	}
}

// A round opened by a restart waits past the last call for a live member
// of the round before that is slow to come back (stopping its workers).
func TestRendezvousRestartWaitsForLiveMembers(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b", "c"} {
		agents[id] = agent(t, addr, fastConfig("run", id, 2, 4))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b", "c")
	if _, err := agents["a"].Restart(ctx, res["a"].round, "worker 0 on node a exited with code 1"); err != nil {
		t.Fatal(err)
	}
	slow := make(chan joined, 1)
	c := agents["c"]
	go func() {
		time.Sleep(1200 * time.Millisecond) // three last calls
		r, err := c.Join(ctx)
		slow <- joined{"c", r, err, 0}
	}()
	delete(agents, "c")
	res = joinAll(ctx, agents)
	res["c"] = <-slow
	checkRound(t, res, 1, "a", "b", "c")
}

// A node that arrives while a round runs registers as waiting; the running
// nodes see it and open a round that admits it.
func TestRendezvousWaitingNodeTriggersRound(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b"} {
		agents[id] = agent(t, addr, fastConfig("run", id, 2, 3))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b")
	round0 := map[string]launch.Round{"a": res["a"].round, "b": res["b"].round}

	late := agent(t, addr, fastConfig("run", "c", 2, 3))
	lateDone := make(chan joined, 1)
	go func() {
		r, err := late.Join(ctx)
		lateDone <- joined{"c", r, err, 0}
	}()
	for id, a := range agents {
		ch, err := a.Watch(ctx, res[id].round)
		if err != nil {
			t.Fatalf("node %s: Watch: %v", id, err)
		}
		if ch.Next != 1 || ch.Reason != "node c waiting to join" {
			t.Fatalf("node %s: Watch returned %+v, want round 1 for node c", id, ch)
		}
	}
	res = joinAll(ctx, agents)
	res["c"] = <-lateDone
	checkRound(t, res, 1, "a", "b", "c")
	// The members of round 0 keep their order; the newcomer comes last.
	if res["c"].round.NodeRank != 2 || res["a"].round.NodeRank != round0["a"].NodeRank || res["b"].round.NodeRank != round0["b"].NodeRank {
		t.Errorf("round 1's order %v after round 0's %v: the members keep their ranks, the newcomer c comes last",
			res["c"].round.Nodes, round0["a"].Nodes)
	}
}

func TestRendezvousJoinTimeout(t *testing.T) {
	addr := rdzvServer(t)
	cfg := fastConfig("run", "a", 2, 3)
	cfg.JoinTimeout = 500 * time.Millisecond
	a := agent(t, addr, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := a.Join(ctx)
	if !errors.Is(err, errs.Timeout) {
		t.Fatalf("Join with 1 of 2 nodes: %v, want a timeout", err)
	}
	if !strings.Contains(err.Error(), "1 of at least 2 nodes joined (a)") {
		t.Errorf("the error does not say who came: %v", err)
	}
	if d := time.Since(start); d < 500*time.Millisecond || d > 5*time.Second {
		t.Errorf("Join gave up after %v, want about 500ms", d)
	}
	// It left the round: another node alone does not find it listed.
	cfg.NodeID = "b"
	b := agent(t, addr, cfg)
	_, err = b.Join(ctx)
	if err == nil || !strings.Contains(err.Error(), "1 of at least 2 nodes joined (b)") {
		t.Errorf("a second lone node: %v", err)
	}
}

// Restarts beyond MaxRestarts fail the run on every node; a finished run
// turns late nodes away.
func TestRendezvousRestartsExhaustedAndFinish(t *testing.T) {
	addr := rdzvServer(t)
	agents := map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b"} {
		cfg := fastConfig("exhaust", id, 2, 2)
		cfg.MaxRestarts = 1
		agents[id] = agent(t, addr, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res := joinAll(ctx, agents)
	ch, err := agents["a"].Restart(ctx, res["a"].round, "worker 0 on node a exited with code 1")
	if err != nil || ch.Next != 1 {
		t.Fatalf("first restart: %+v, %v", ch, err)
	}
	ch, err = agents["b"].Watch(ctx, res["b"].round)
	if err != nil || ch.Next != 1 || ch.Reason != "worker 0 on node a exited with code 1" {
		t.Fatalf("node b's Watch: %+v, %v", ch, err)
	}
	res = joinAll(ctx, agents)
	if res["a"].err != nil || res["a"].round.Number != 1 {
		t.Fatalf("round 1: %+v", res)
	}
	_, err = agents["b"].Restart(ctx, res["b"].round, "worker 1 on node b exited with code 2")
	if !errors.Is(err, launch.ErrRunFailed) || !strings.Contains(err.Error(), "1 restart allowed are used up") {
		t.Fatalf("second restart with one allowed: %v", err)
	}
	if _, err := agents["a"].Watch(ctx, res["a"].round); !errors.Is(err, launch.ErrRunFailed) ||
		!strings.Contains(err.Error(), "worker 1 on node b exited with code 2") {
		t.Fatalf("node a's Watch after the run failed: %v", err)
	}

	// Another run on the same store: node a finishes first and waits for
	// b; b's worker fails, so a runs again; then both finish.
	agents = map[string]*launch.Rendezvous{}
	for _, id := range []string{"a", "b"} {
		agents[id] = agent(t, addr, fastConfig("finish", id, 1, 2))
	}
	res = joinAll(ctx, agents)
	checkRound(t, res, 0, "a", "b")
	finished := make(chan launch.Change, 1)
	go func() {
		ch, err := agents["a"].Finish(ctx, res["a"].round)
		if err != nil {
			t.Errorf("node a's Finish: %v", err)
		}
		finished <- ch
	}()
	select {
	case ch := <-finished:
		t.Fatalf("node a's Finish returned %+v while node b's workers run", ch)
	case <-time.After(300 * time.Millisecond):
	}
	if ch, err := agents["b"].Restart(ctx, res["b"].round, "worker 1 on node b exited with code 1"); err != nil || ch.Next != 1 {
		t.Fatalf("node b's Restart: %+v, %v", ch, err)
	}
	if ch := <-finished; ch.Done || ch.Next != 1 || ch.Reason != "worker 1 on node b exited with code 1" {
		t.Fatalf("node a's Finish after b's restart: %+v, want round 1", ch)
	}
	res = joinAll(ctx, agents)
	checkRound(t, res, 1, "a", "b")
	var wg sync.WaitGroup
	for id, a := range agents {
		wg.Go(func() {
			if ch, err := a.Finish(ctx, res[id].round); err != nil || !ch.Done {
				t.Errorf("node %s's Finish: %+v, %v", id, ch, err)
			}
		})
	}
	wg.Wait()
	if _, err := agent(t, addr, fastConfig("finish", "c", 1, 2)).Join(ctx); !errors.Is(err, launch.ErrRunComplete) {
		t.Fatalf("a late node's Join: %v, want ErrRunComplete", err)
	}
}

func TestRendezvousConfigChecked(t *testing.T) {
	for _, cfg := range []launch.RendezvousConfig{
		{RunID: "", NodeID: "a", MinNodes: 1, MaxNodes: 1},
		{RunID: "r/x", NodeID: "a", MinNodes: 1, MaxNodes: 1},
		{RunID: "r", NodeID: "", MinNodes: 1, MaxNodes: 1},
		{RunID: "r", NodeID: "a", MinNodes: 3, MaxNodes: 2},
		{RunID: "r", NodeID: "a", MinNodes: 0, MaxNodes: 2},
		{RunID: "r", NodeID: "a", MinNodes: 1, MaxNodes: 2, Heartbeat: time.Second, LostAfter: time.Second},
	} {
		if _, err := launch.NewRendezvous(store.NewMemory(), cfg); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("NewRendezvous(%+v): %v, want an invalid argument", cfg, err)
		}
	}
}
