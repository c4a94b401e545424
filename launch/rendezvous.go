package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// Defaults of RendezvousConfig.
const (
	// DefaultJoinTimeout bounds how long a round may take to gather
	// MinNodes nodes.
	DefaultJoinTimeout = 60 * time.Second
	// DefaultLastCall is how long a round that has MinNodes nodes (but
	// fewer than MaxNodes) stays open for more.
	DefaultLastCall = time.Second
	// DefaultRejoinWait bounds how long a round opened by a restart waits
	// for the live members of the round before.
	DefaultRejoinWait = 30 * time.Second
	// DefaultHeartbeat is how often an agent bumps its heartbeat counter.
	DefaultHeartbeat = time.Second
	// DefaultLostAfter is how long a node's heartbeat counter may stand
	// still before the node counts as lost.
	DefaultLostAfter = 3 * time.Second
	// DefaultPoll is how often a blocked call reads the rendezvous state.
	DefaultPoll = 100 * time.Millisecond
)

// StorePrefixEnv names the key prefix, in the store at MASTER_ADDR and
// MASTER_PORT, under which the workers of one rendezvous round meet
// (Job.StorePrefix). `tandem run -rdzv-endpoint` sets it; its presence says
// that the store is already served (by `tandem store`, in Tandem's protocol)
// and that no worker serves one of its own.
const StorePrefixEnv = "TANDEM_STORE_PREFIX"

// RendezvousStore is what a Rendezvous needs of a key-value store: the
// methods of comm/store.Store that it uses, with the same semantics, so that
// any of those stores (a client of `tandem store`, store.NewMemory in tests)
// serves. Package launch depends on no store itself.
type RendezvousStore interface {
	// Get returns key's value, blocking until the key exists.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add adds delta to the counter under key and returns the new value.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareSet sets key to desired if it holds expected (or is absent
	// and expected is empty) and returns the value afterwards.
	CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
}

// RendezvousConfig describes one node's part in an elastic job.
type RendezvousConfig struct {
	// RunID names the job; every key lives under "RunID/". Nodes with the
	// same RunID on the same store form one job.
	RunID string
	// NodeID names this node among the job's nodes; it must be unique
	// among the live nodes (`tandem run` defaults to HOSTNAME-PID). A node
	// that comes back under the same id is a new member.
	NodeID string
	// MinNodes and MaxNodes bound the nodes of a round: a round forms once
	// MinNodes have joined and the last call is over, or at once with
	// MaxNodes.
	MinNodes, MaxNodes int
	// MaxRestarts bounds the round number: opening round MaxRestarts+1
	// fails the run instead.
	MaxRestarts int
	// JoinTimeout bounds how long Join waits for a round to form (default
	// DefaultJoinTimeout).
	JoinTimeout time.Duration
	// LastCall is how long the first round, once it has MinNodes nodes,
	// waits for more (default DefaultLastCall).
	LastCall time.Duration
	// RejoinWait bounds how long a round opened by a restart, once it has
	// MinNodes nodes, waits for the live members of the round before
	// (default DefaultRejoinWait); it closes as soon as every one of them
	// has joined or is lost. Give it at least the time an agent needs to
	// stop its workers.
	RejoinWait time.Duration
	// Heartbeat is how often this node bumps its counter (default
	// DefaultHeartbeat), and LostAfter how long another node's counter may
	// stand still before that node is lost (default DefaultLostAfter).
	Heartbeat, LostAfter time.Duration
	// Poll is how often blocked calls read the state (default DefaultPoll).
	Poll time.Duration
}

// Round is one formed round of a rendezvous: who is in it and where this
// node sits.
type Round struct {
	// Number counts the rounds of the run from 0; it is also the number of
	// restarts so far (TANDEM_RESTART_COUNT).
	Number int
	// Nodes lists the members' node ids in node-rank order.
	Nodes []string
	// NodeRank is this node's index in Nodes.
	NodeRank int
	// Reason says why this round replaced the one before ("" for round 0):
	// "worker 3 on node a exited with code 1", "node c lost: no heartbeat
	// for 3s", "node d waiting to join".
	Reason string
	// StorePrefix is where this round's workers meet in the store:
	// "RunID/round/Number" (Job.StorePrefix).
	StorePrefix string
}

// NumNodes is the number of nodes in the round.
func (r Round) NumNodes() int { return len(r.Nodes) }

// Change is why a running round ends: a new round was opened (Next is its
// number, Reason why) or the run is complete (Done).
type Change struct {
	Next   int
	Reason string
	Done   bool
}

// ErrRunComplete is returned by Join when the run already completed: every
// worker of its last round exited 0. It wraps errs.Closed.
var ErrRunComplete = fmt.Errorf("%w: launch: rendezvous: the run is complete", errs.Closed)

// ErrRunFailed is wrapped by the errors of every call once the run has
// failed for good (its restarts are exhausted); the error says why. It
// wraps errs.PeerLost.
var ErrRunFailed = fmt.Errorf("%w: launch: rendezvous: the run failed", errs.PeerLost)

// rdzvState is the state of a run, kept as JSON under one key and changed
// only by compare-and-set, so that every change is atomic.
type rdzvState struct {
	// Round is the current round; Complete says it has formed and runs.
	Round    int  `json:"round"`
	Complete bool `json:"complete"`
	// Participants: the nodes of the round, in join order while it forms,
	// in node-rank order once complete.
	Participants []string `json:"participants"`
	// Waiting: nodes that arrived while the round runs; their presence asks
	// for a new round.
	Waiting []string `json:"waiting,omitempty"`
	// Expected: the previous round's members and waiting nodes, when this
	// round was opened; once each has joined or is lost, the round closes
	// without waiting for the last call.
	Expected []string `json:"expected,omitempty"`
	// Reason: why this round was opened.
	Reason string `json:"reason,omitempty"`
	// Finished: the members whose workers of this round all exited 0.
	Finished []string `json:"finished,omitempty"`
	// Done: the run completed; Failed: it failed for good, and why.
	Done   bool   `json:"done,omitempty"`
	Failed string `json:"failed,omitempty"`
}

// Rendezvous is one node's agent in an elastic job's rendezvous, held in a
// store every node reaches (a `tandem store`, so that no training node holds
// it). Nodes meet in numbered rounds: Join blocks until a round has formed
// and returns the members and this node's rank; Watch blocks while the
// round runs, until a new round must start (another node's worker failed,
// a node was lost, a node is waiting to join) or the run is complete;
// Restart opens the next round after a failure on this node; Finish
// reports that this node's workers all exited 0 and waits for the other
// nodes' (an exit barrier), after which the run is complete. From the first Join on, a goroutine bumps this node's
// heartbeat counter; Close stops it. A Rendezvous is meant for one agent
// loop: its methods are not for concurrent use, except Close.
//
// Keys, under "RunID/": "rdzv/state" (the run's state, changed by
// compare-and-set) and "rdzv/hb/NODE" (each node's heartbeat counter).
// The workers of round N meet under "RunID/round/N".
type Rendezvous struct {
	st  RendezvousStore
	cfg RendezvousConfig

	stateKey string

	hbOnce sync.Once
	hbStop context.CancelFunc
	hbDone chan struct{}

	// seen tracks other nodes' heartbeat counters: the last value and when
	// this node saw it change (or first saw it).
	seen map[string]heartbeatSeen
	// joined is the round this agent last joined as a participant (-1:
	// none), which tells its own entry from one that an earlier agent with
	// the same node id left behind.
	joined int
}

type heartbeatSeen struct {
	value   int64
	changed time.Time
}

// NewRendezvous checks cfg, fills in its defaults and returns the agent of
// node cfg.NodeID for run cfg.RunID over st. It touches the store only from
// the first Join on.
func NewRendezvous(st RendezvousStore, cfg RendezvousConfig) (*Rendezvous, error) {
	bad := func(format string, a ...any) (*Rendezvous, error) {
		return nil, fmt.Errorf("%w: launch: rendezvous: "+format, append([]any{errs.InvalidArgument}, a...)...)
	}
	switch {
	case st == nil:
		return bad("no store")
	case cfg.RunID == "" || strings.ContainsAny(cfg.RunID, "/ \t\n"):
		return bad("run id %q: want a non-empty name without slashes or spaces, the same on every node", cfg.RunID)
	case cfg.NodeID == "" || strings.ContainsAny(cfg.NodeID, "/ \t\n"):
		return bad("node id %q: want a non-empty name without slashes or spaces, unique among the nodes", cfg.NodeID)
	case cfg.MinNodes < 1 || cfg.MaxNodes < cfg.MinNodes:
		return bad("nodes %d:%d: want 1 <= MIN <= MAX", cfg.MinNodes, cfg.MaxNodes)
	case cfg.MaxRestarts < 0:
		return bad("max restarts %d: must not be negative", cfg.MaxRestarts)
	case cfg.JoinTimeout < 0 || cfg.LastCall < 0 || cfg.RejoinWait < 0 || cfg.Heartbeat < 0 || cfg.LostAfter < 0 || cfg.Poll < 0:
		return bad("negative duration in %+v", cfg)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.JoinTimeout, DefaultJoinTimeout)
	def(&cfg.LastCall, DefaultLastCall)
	def(&cfg.RejoinWait, DefaultRejoinWait)
	def(&cfg.Heartbeat, DefaultHeartbeat)
	def(&cfg.LostAfter, DefaultLostAfter)
	def(&cfg.Poll, DefaultPoll)
	if cfg.LostAfter < 2*cfg.Heartbeat {
		return bad("lost-after %v is less than two heartbeats (%v): one late beat would lose a node", cfg.LostAfter, cfg.Heartbeat)
	}
	return &Rendezvous{
		st: st, cfg: cfg,
		stateKey: cfg.RunID + "/rdzv/state",
		seen:     map[string]heartbeatSeen{},
		joined:   -1,
	}, nil
}

// Config returns the configuration in force, defaults filled in.
func (r *Rendezvous) Config() RendezvousConfig { return r.cfg }

func (r *Rendezvous) hbKey(node string) string { return r.cfg.RunID + "/rdzv/hb/" + node }

// StorePrefix is where the workers of round n of run runID meet in the
// rendezvous store.
func StorePrefix(runID string, n int) string { return runID + "/round/" + strconv.Itoa(n) }

// startHeartbeat starts bumping this node's counter, once.
func (r *Rendezvous) startHeartbeat(ctx context.Context) error {
	var err error
	r.hbOnce.Do(func() {
		// The first beat is synchronous: a node is never listed without one.
		if _, err = r.st.Add(ctx, r.hbKey(r.cfg.NodeID), 1); err != nil {
			err = fmt.Errorf("launch: rendezvous: node %s: first heartbeat: %w", r.cfg.NodeID, err)
			return
		}
		hctx, stop := context.WithCancel(context.Background())
		r.hbStop, r.hbDone = stop, make(chan struct{})
		go func() {
			defer close(r.hbDone)
			t := time.NewTicker(r.cfg.Heartbeat)
			defer t.Stop()
			for {
				select {
				case <-hctx.Done():
					return
				case <-t.C:
				}
				// A failed beat is retried at the next tick; a store that
				// stays away makes the state calls fail as well.
				bctx, cancel := context.WithTimeout(hctx, r.cfg.LostAfter)
				_, _ = r.st.Add(bctx, r.hbKey(r.cfg.NodeID), 1)
				cancel()
			}
		}()
	})
	return err
}

// Close stops this node's heartbeat; the other nodes lose it after
// LostAfter unless the run is complete. It does not close the store.
func (r *Rendezvous) Close() error {
	r.hbOnce.Do(func() {}) // no heartbeat may start after Close
	if r.hbStop != nil {
		r.hbStop()
		<-r.hbDone
	}
	return nil
}

// load reads the state, creating the initial one when absent.
func (r *Rendezvous) load(ctx context.Context) (rdzvState, []byte, error) {
	init, _ := json.Marshal(rdzvState{Participants: []string{}})
	raw, err := r.st.CompareSet(ctx, r.stateKey, nil, init)
	if err != nil {
		return rdzvState{}, nil, fmt.Errorf("launch: rendezvous: reading the state of run %s: %w", r.cfg.RunID, err)
	}
	var s rdzvState
	if err := json.Unmarshal(raw, &s); err != nil {
		return rdzvState{}, nil, fmt.Errorf("%w: launch: rendezvous: the state of run %s under %q is not a rendezvous state (%v): is another program using this run id?",
			errs.Mismatch, r.cfg.RunID, r.stateKey, err)
	}
	return s, raw, nil
}

// update applies change to the state by compare-and-set until it sticks or
// change declines (returns false). It returns the state afterwards and
// whether change's edit was stored.
func (r *Rendezvous) update(ctx context.Context, change func(*rdzvState) bool) (rdzvState, bool, error) {
	for {
		s, raw, err := r.load(ctx)
		if err != nil {
			return s, false, err
		}
		next := s
		next.Participants = slices.Clone(s.Participants)
		next.Waiting = slices.Clone(s.Waiting)
		next.Expected = slices.Clone(s.Expected)
		next.Finished = slices.Clone(s.Finished)
		if !change(&next) {
			return s, false, nil
		}
		enc, _ := json.Marshal(next)
		got, err := r.st.CompareSet(ctx, r.stateKey, raw, enc)
		if err != nil {
			return s, false, fmt.Errorf("launch: rendezvous: updating the state of run %s: %w", r.cfg.RunID, err)
		}
		if bytes.Equal(got, enc) {
			return next, true, nil
		}
		if err := ctx.Err(); err != nil {
			return s, false, fmt.Errorf("%w: launch: rendezvous: updating the state of run %s: %w", errs.Timeout, r.cfg.RunID, context.Cause(ctx))
		}
	}
}

// lost returns the nodes among nodes (other than this one) whose heartbeat
// counter has not moved for LostAfter, as this node has watched it.
func (r *Rendezvous) lost(ctx context.Context, nodes []string) ([]string, error) {
	now := time.Now()
	var out []string
	for _, n := range nodes {
		if n == r.cfg.NodeID {
			continue
		}
		v, err := r.st.Add(ctx, r.hbKey(n), 0)
		if err != nil {
			return nil, fmt.Errorf("launch: rendezvous: reading node %s's heartbeat: %w", n, err)
		}
		s, ok := r.seen[n]
		if !ok || s.value != v {
			r.seen[n] = heartbeatSeen{value: v, changed: now}
			continue
		}
		if now.Sub(s.changed) >= r.cfg.LostAfter {
			out = append(out, n)
		}
	}
	return out, nil
}

// failedErr is the error of a run that failed for good.
func failedErr(s rdzvState) error {
	return fmt.Errorf("%w: %s", ErrRunFailed, s.Failed)
}

// sleep waits one poll interval or until ctx ends.
func (r *Rendezvous) sleep(ctx context.Context) error {
	t := time.NewTimer(r.cfg.Poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// Join blocks until this node is a member of a formed round and returns
// it. A round forms at once when MaxNodes nodes have joined. With fewer but
// at least MinNodes, round 0 forms when the last call is over (LastCall
// since MinNodes were there, as this node saw it), and a round opened by a
// restart as soon as every member of the previous round (and every node
// that was waiting) has joined or is lost, or after RejoinWait.
// Joined nodes whose heartbeat stops are dropped before the round forms.
//
// A node that arrives while a round runs registers as waiting (unless the
// round already has MaxNodes nodes) and so asks the running nodes for a new
// round, which it joins. Join fails with an error wrapping errs.Timeout
// when no round with this node forms within JoinTimeout (this node then
// leaves the round it joined), with ErrRunComplete when the run is
// complete, with ErrRunFailed when it failed, and with the context's cause
// when ctx ends.
func (r *Rendezvous) Join(ctx context.Context) (Round, error) {
	if err := r.startHeartbeat(ctx); err != nil {
		return Round{}, err
	}
	me := r.cfg.NodeID
	deadline := time.Now().Add(r.cfg.JoinTimeout)
	var (
		lastCallRound = -1 // the round whose last call this node has timed
		lastCallStart time.Time
	)
	for {
		s, _, err := r.load(ctx)
		if err != nil {
			return Round{}, err
		}
		switch {
		case s.Done:
			return Round{}, fmt.Errorf("%w: node %s arrived after run %s completed (start a new run with another run id)", ErrRunComplete, me, r.cfg.RunID)
		case s.Failed != "":
			return Round{}, failedErr(s)
		case s.Complete && r.joined == s.Round && slices.Contains(s.Participants, me):
			// The round this node joined has formed.
			return r.roundOf(s), nil
		case s.Complete:
			// A round runs: wait for the next, asking for it if there is room.
			if !slices.Contains(s.Waiting, me) && (len(s.Participants) < r.cfg.MaxNodes || slices.Contains(s.Participants, me)) {
				if _, _, err := r.update(ctx, func(n *rdzvState) bool {
					if !n.Complete || n.Round != s.Round || n.Done || n.Failed != "" || slices.Contains(n.Waiting, me) {
						return false
					}
					n.Waiting = append(n.Waiting, me)
					return true
				}); err != nil {
					return Round{}, err
				}
			}
		case !slices.Contains(s.Participants, me):
			if len(s.Participants) >= r.cfg.MaxNodes {
				break // full; it closes at once, and this node waits for the next round
			}
			_, added, err := r.update(ctx, func(n *rdzvState) bool {
				if n.Complete || n.Round != s.Round || n.Done || n.Failed != "" || slices.Contains(n.Participants, me) || len(n.Participants) >= r.cfg.MaxNodes {
					return false
				}
				n.Participants = append(n.Participants, me)
				return true
			})
			if err != nil {
				return Round{}, err
			}
			if added {
				r.joined = s.Round
			}
			continue // look again at once: this node may have filled the round
		default:
			// An entry left by an earlier agent with this id is this one's
			// now: the round has not formed yet.
			r.joined = s.Round
			// Forming, with this node in it: drop the lost, close when due.
			lost, err := r.lost(ctx, s.Participants)
			if err != nil {
				return Round{}, err
			}
			if len(lost) > 0 {
				if _, _, err := r.update(ctx, func(n *rdzvState) bool {
					if n.Complete || n.Round != s.Round {
						return false
					}
					before := len(n.Participants)
					n.Participants = slices.DeleteFunc(n.Participants, func(p string) bool { return slices.Contains(lost, p) })
					return len(n.Participants) != before
				}); err != nil {
					return Round{}, err
				}
				continue
			}
			n := len(s.Participants)
			switch {
			case n < r.cfg.MinNodes:
				lastCallRound = -1
			case lastCallRound != s.Round:
				lastCallRound, lastCallStart = s.Round, time.Now()
			}
			var closeNow bool
			switch {
			case n >= r.cfg.MaxNodes:
				closeNow = true
			case n < r.cfg.MinNodes:
			case len(s.Expected) == 0:
				closeNow = time.Since(lastCallStart) >= r.cfg.LastCall
			default:
				// A restart: wait for the live members of the last round
				// (and the nodes that were waiting), who come as soon as
				// they have stopped their workers.
				missing := slices.DeleteFunc(slices.Clone(s.Expected), func(p string) bool { return slices.Contains(s.Participants, p) })
				gone, err := r.lost(ctx, missing)
				if err != nil {
					return Round{}, err
				}
				closeNow = len(gone) == len(missing) || time.Since(lastCallStart) >= r.cfg.RejoinWait
			}
			if closeNow {
				if _, _, err := r.update(ctx, func(n *rdzvState) bool {
					if n.Complete || n.Round != s.Round || !slices.Equal(n.Participants, s.Participants) {
						return false
					}
					n.Complete = true
					n.Participants = rankOrder(n.Participants, n.Expected)
					n.Waiting = nil
					return true
				}); err != nil {
					return Round{}, err
				}
				continue
			}
		}
		if time.Now().After(deadline) {
			return Round{}, r.joinTimeout(ctx, s)
		}
		if err := r.sleep(ctx); err != nil {
			return Round{}, fmt.Errorf("launch: rendezvous: node %s joining run %s: %w", me, r.cfg.RunID, err)
		}
	}
}

// roundOf describes the complete round s for this node.
func (r *Rendezvous) roundOf(s rdzvState) Round {
	return Round{
		Number: s.Round, Nodes: slices.Clone(s.Participants),
		NodeRank: slices.Index(s.Participants, r.cfg.NodeID), Reason: s.Reason,
		StorePrefix: StorePrefix(r.cfg.RunID, s.Round),
	}
}

// rankOrder orders a formed round's members: those of the previous round
// first (in the order they had there, so that surviving ranks move as
// little as they can), then newcomers in the order they joined.
func rankOrder(participants, expected []string) []string {
	out := make([]string, 0, len(participants))
	for _, p := range expected {
		if slices.Contains(participants, p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, p := range participants {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// joinTimeout leaves the forming round and says why no round formed.
func (r *Rendezvous) joinTimeout(ctx context.Context, s rdzvState) error {
	me := r.cfg.NodeID
	_, _, _ = r.update(ctx, func(n *rdzvState) bool {
		if n.Round != s.Round {
			return false
		}
		if !n.Complete && slices.Contains(n.Participants, me) {
			n.Participants = slices.DeleteFunc(n.Participants, func(p string) bool { return p == me })
			return true
		}
		if n.Complete && slices.Contains(n.Waiting, me) {
			n.Waiting = slices.DeleteFunc(n.Waiting, func(p string) bool { return p == me })
			return true
		}
		return false
	})
	if s.Complete {
		return fmt.Errorf("%w: launch: rendezvous: node %s waited %v for round %d of run %s to end and admit it, but it did not (its %d nodes are the most -nnodes allows, or the running nodes do not watch the store)",
			errs.Timeout, me, r.cfg.JoinTimeout, s.Round, r.cfg.RunID, len(s.Participants))
	}
	return fmt.Errorf("%w: launch: rendezvous: round %d of run %s did not form within the join timeout %v: %d of at least %d nodes joined (%s); start more nodes, lower MIN, or give a longer join timeout",
		errs.Timeout, s.Round, r.cfg.RunID, r.cfg.JoinTimeout, len(s.Participants), r.cfg.MinNodes, strings.Join(s.Participants, ", "))
}

// Watch blocks while round runs and returns why it must end: another node
// opened a new round (Change.Next, Change.Reason), or the run is complete
// (Change.Done). It opens the new round itself, with Restart, when a member
// of round is lost (its heartbeat stood still for LostAfter: reason "node X
// lost: no heartbeat for 3s") or a node waits to join ("node X waiting to
// join"). It fails with ErrRunFailed when the run failed (also when that
// restart would exceed MaxRestarts) and with the context's cause when ctx
// ends.
func (r *Rendezvous) Watch(ctx context.Context, round Round) (Change, error) {
	for {
		s, _, err := r.load(ctx)
		if err != nil {
			return Change{}, err
		}
		switch {
		case s.Done:
			return Change{Done: true}, nil
		case s.Failed != "":
			return Change{}, failedErr(s)
		case s.Round != round.Number:
			return Change{Next: s.Round, Reason: s.Reason}, nil
		case len(s.Waiting) > 0:
			return r.Restart(ctx, round, fmt.Sprintf("node %s waiting to join", strings.Join(s.Waiting, ", ")))
		}
		lost, err := r.lost(ctx, round.Nodes)
		if err != nil {
			return Change{}, err
		}
		if len(lost) > 0 {
			return r.Restart(ctx, round, fmt.Sprintf("node %s lost: no heartbeat for %v", strings.Join(lost, ", "), r.cfg.LostAfter))
		}
		if err := r.sleep(ctx); err != nil {
			return Change{}, fmt.Errorf("launch: rendezvous: node %s watching round %d of run %s: %w", r.cfg.NodeID, round.Number, r.cfg.RunID, err)
		}
	}
}

// Restart ends round and opens the next one for reason, unless another
// node did first (then it returns that node's round and reason) or the run
// is complete (Change.Done). When the next round would exceed MaxRestarts,
// it marks the run failed instead and returns an error wrapping
// ErrRunFailed, which every node's Join and Watch then return too.
func (r *Rendezvous) Restart(ctx context.Context, round Round, reason string) (Change, error) {
	s, stored, err := r.update(ctx, func(n *rdzvState) bool {
		if n.Done || n.Failed != "" || n.Round != round.Number {
			return false
		}
		if round.Number+1 > r.cfg.MaxRestarts {
			n.Failed = fmt.Sprintf("round %d of run %s ended (%s), and the %s allowed are used up", round.Number, r.cfg.RunID, reason, pluralRestarts(r.cfg.MaxRestarts))
			return true
		}
		prev := n.Participants
		if !n.Complete {
			prev = round.Nodes
		}
		expected := slices.Clone(prev)
		for _, w := range n.Waiting {
			if !slices.Contains(expected, w) {
				expected = append(expected, w)
			}
		}
		*n = rdzvState{Round: round.Number + 1, Participants: []string{}, Expected: expected, Reason: reason}
		return true
	})
	switch {
	case err != nil:
		return Change{}, err
	case s.Done:
		return Change{Done: true}, nil
	case s.Failed != "":
		return Change{}, failedErr(s)
	case !stored && s.Round == round.Number:
		return Change{}, fmt.Errorf("%w: launch: rendezvous: could not open the round after %d of run %s", errs.Mismatch, round.Number, r.cfg.RunID)
	}
	return Change{Next: s.Round, Reason: s.Reason}, nil
}

func pluralRestarts(n int) string {
	if n == 1 {
		return "1 restart"
	}
	return strconv.Itoa(n) + " restarts"
}

// Finish records that every worker of round on this node exited 0 and
// blocks until the other members' workers have too: then the run is
// complete (Change.Done), nodes that arrive later are turned away
// (ErrRunComplete), and every agent can exit. If instead another node opens
// a new round (its worker failed, a node is waiting to join), Finish returns
// that round's Change and the agent joins it; if a member that has not
// finished is lost, Finish opens the new round itself. It fails like
// Watch.
func (r *Rendezvous) Finish(ctx context.Context, round Round) (Change, error) {
	me := r.cfg.NodeID
	for {
		s, _, err := r.update(ctx, func(n *rdzvState) bool {
			if n.Done || n.Failed != "" || n.Round != round.Number || !n.Complete || slices.Contains(n.Finished, me) {
				return false
			}
			n.Finished = append(n.Finished, me)
			n.Done = !slices.ContainsFunc(n.Participants, func(p string) bool { return !slices.Contains(n.Finished, p) })
			return true
		})
		switch {
		case err != nil:
			return Change{}, err
		case s.Done:
			return Change{Done: true}, nil
		case s.Failed != "":
			return Change{}, failedErr(s)
		case s.Round != round.Number:
			return Change{Next: s.Round, Reason: s.Reason}, nil
		case !s.Complete:
			return Change{}, fmt.Errorf("%w: launch: rendezvous: round %d of run %s is not formed; it cannot finish", errs.InvalidArgument, round.Number, r.cfg.RunID)
		}
		running := slices.DeleteFunc(slices.Clone(s.Participants), func(p string) bool { return slices.Contains(s.Finished, p) })
		lost, err := r.lost(ctx, running)
		if err != nil {
			return Change{}, err
		}
		if len(lost) > 0 {
			return r.Restart(ctx, round, fmt.Sprintf("node %s lost: no heartbeat for %v", strings.Join(lost, ", "), r.cfg.LostAfter))
		}
		if err := r.sleep(ctx); err != nil {
			return Change{}, fmt.Errorf("launch: rendezvous: node %s waiting for the other nodes to finish round %d of run %s: %w", me, round.Number, r.cfg.RunID, err)
		}
	}
}
