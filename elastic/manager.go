package elastic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/errs"
)

// Progress is how far the job has come: the number of committed steps and
// the stream positions (examples) they consumed. Every member of a round
// holds the same Progress once the round is formed.
type Progress struct {
	Step    int64
	Samples int64
}

// Round is one membership of the job: its process group and the batch
// rule's answer for its size.
type Round struct {
	// Number counts the rounds the job has formed, from 1.
	Number int
	// Group is the round's process group (world rank = Rank).
	Group *comm.ProcessGroup
	// Rank and Size: this member's place and the number of members.
	Rank, Size int
	// Members are the members' IDs in rank order.
	Members []string
	// Changed: Quorum formed this round just now (a new group: rebuild
	// what depends on it, such as a ddp.DDP); false when it returned the
	// round already running.
	Changed bool
	// Healed: this member loaded a peer's State when the round formed.
	Healed bool
	// PerRank is the examples each member takes per step, Global the
	// total, LRScale the factor for the base learning rate (Config.Batch).
	PerRank, Global int
	LRScale         float64
}

// Event is one reconfiguration as this member saw it.
type Event struct {
	Round  int
	Size   int
	Reason string
	// Detected is when this member learned the membership had to change
	// (a failed step or commit, or newcomers at a commit); Resumed is when
	// the new round was formed and healed.
	Detected, Resumed time.Time
	// Step is the committed step the round starts from.
	Step   int64
	Healed bool
}

// Manager keeps one member of an elastic job in step with the others:
// it forms rounds (Quorum), decides together with the others whether a
// step counts (Commit), heals members that are behind, and watches for
// newcomers. It is not safe for concurrent use, except Close.
//
// A training loop:
//
//	m, err := elastic.New(ctx, st, elastic.Config{MinSize: 2, Batch: elastic.FixedGlobalBatch(96)})
//	defer m.Close()
//	for m.Progress().Step < steps {
//		r, err := m.Quorum(ctx, elastic.ModuleState(model, opt))
//		if r.Changed { net, err = ddp.New(ctx, r.Group, model); opt.SetLR(lr * r.LRScale) }
//		b, err := loader.Batch(ctx, m.Indices(stream))
//		_, stepErr := net.Step(ctx, b.X, b.Y)
//		if ok, err := m.Commit(ctx, stepErr); err != nil { return err } else if ok { opt.Step() }
//	}
//	m.Finish(ctx)
type Manager struct {
	cfg Config
	st  store.Store // the job's view of the store

	res      *result
	round    Round
	pg       *comm.ProcessGroup
	progress Progress
	fresh    bool // never in a round
	rounds   int  // rounds this member was in

	dirty      error     // why the next Quorum must form a new round
	detectedAt time.Time // when dirty was set
	events     []Event

	waiting   atomic.Int64                      // the waiting counter as last polled
	current   atomic.Int64                      // the round this member runs in, 0 between rounds
	live      atomic.Pointer[comm.ProcessGroup] // its group, nil between rounds
	stopWatch context.CancelFunc
	watchDone chan struct{}
	closeOnce sync.Once
}

// New returns a member of the job that meets in st (a store every member
// reaches and that outlives any one of them: a standalone `tandem store`,
// not one a training process serves). It does not join a round yet:
// Quorum does. st stays the caller's.
func New(ctx context.Context, st store.Store, cfg Config) (*Manager, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: elastic: New: nil store", errs.InvalidArgument)
	}
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, st: store.NewPrefix("elastic/"+cfg.Job, st), fresh: true,
		dirty: errors.New("first round"), detectedAt: time.Now()}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.stopWatch, m.watchDone = cancel, make(chan struct{})
	go m.watch(wctx)
	return m, nil
}

// watch polls the waiting counter.
func (m *Manager) watch(ctx context.Context) {
	defer close(m.watchDone)
	t := time.NewTicker(m.cfg.WatchInterval)
	defer t.Stop()
	for {
		// A collective notices a lost member only when it waits on that
		// member; one waiting on another, or none running, would carry on.
		// Abort the round's group as soon as its transport knows a member
		// is gone, so that this member and (by the abort) every other one
		// fail their step at once.
		if pg := m.live.Load(); pg != nil {
			if err := pg.PeerFailure(); err != nil {
				pg.Abort(fmt.Errorf("elastic: a member of the round is gone: %w", err))
			}
		}
		c, cancel := context.WithTimeout(ctx, 5*m.cfg.WatchInterval+time.Second)
		if v, err := counter(c, m.st, keyWaiting); err == nil {
			m.waiting.Store(v)
		}
		if q := m.current.Load(); q > 0 {
			m.st.Add(c, roundKey(int(q), "alive"), 1)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ID is this member's name.
func (m *Manager) ID() string { return m.cfg.ID }

// Progress is the committed progress.
func (m *Manager) Progress() Progress { return m.progress }

// Events lists the reconfigurations this member went through, oldest
// first, the first formation included.
func (m *Manager) Events() []Event { return append([]Event(nil), m.events...) }

// Restarts is the number of rounds formed after this member's first.
func (m *Manager) Restarts() int { return max(m.rounds-1, 0) }

// Indices returns the stream indices this member trains on in the next
// step: its rank's share of the next global batch.
func (m *Manager) Indices(s *Stream) []int {
	r := m.round
	return s.Indices(m.progress.Samples+int64(r.Rank*r.PerRank), r.PerRank)
}

// Quorum returns the round to run the next step in. While nothing has
// failed and nobody waits to join, that is the running round (Changed
// false) at the cost of a field read. Otherwise it leaves the old round
// (aborting its group, so that every peer notices at once), joins the next
// one, connects its process group and, when some member is behind or new,
// sends rank 0's state (the most progress) to every member: state is
// loaded on those that were behind, and Progress follows.
func (m *Manager) Quorum(ctx context.Context, state State) (Round, error) {
	if m.dirty == nil && m.pg != nil {
		m.round.Changed = false
		m.round.Healed = false
		return m.round, nil
	}
	if state == nil {
		return Round{}, fmt.Errorf("%w: elastic: Quorum: nil State", errs.InvalidArgument)
	}
	detected, why := m.detectedAt, m.dirty
	prevSize, prevWaiting := 0, int64(0)
	m.current.Store(0)
	m.live.Store(nil)
	if m.pg != nil {
		prevSize, prevWaiting = m.round.Size, m.res.Waiting
		// Leave the old group in the background: its abort tells the
		// other members at once, but then waits (up to a few seconds)
		// for answers that a stopped member never gives.
		old, number := m.pg, m.round.Number
		go func() {
			old.Abort(fmt.Errorf("%w: elastic: leaving round %d: %v", comm.ErrClosed, number, why))
			old.Close()
		}()
		m.pg = nil
	}
	deadline := time.Now().Add(m.cfg.JoinTimeout)
	latest, err := counter(ctx, m.st, keyLatest)
	if err != nil {
		return Round{}, fmt.Errorf("elastic: reading the latest round: %w", err)
	}
	q := max(m.round.Number+1, int(latest)+1)
	// A member the job went on without (its link was cut, or it was
	// stopped, while the others formed a round) is an outsider now, like
	// a newcomer: the running members only make room for it once it
	// announces itself, and it must not form a round of its own beside
	// theirs.
	leftBehind := !m.fresh && int(latest) > m.round.Number
	if leftBehind {
		m.cfg.Logger.Info("elastic: the job went on without this member; rejoining", "round", m.round.Number, "latest", latest, "id", m.cfg.ID)
		prevSize = 0
	}
	if m.fresh || leftBehind {
		// A newcomer says so first, so that running members make room.
		if _, err := m.st.Add(ctx, keyWaiting, 1); err != nil {
			return Round{}, fmt.Errorf("elastic: announcing this member: %w", err)
		}
	}
	for {
		expected := unknownSize
		if prevSize > 0 {
			w, err := counter(ctx, m.st, keyWaiting)
			if err != nil {
				return Round{}, fmt.Errorf("elastic: %w", err)
			}
			expected = prevSize + int(max(w-prevWaiting, 0))
		}
		rec := record{ID: m.cfg.ID, Step: m.progress.Step, Samples: m.progress.Samples, Fresh: m.fresh}
		res, err := m.joinRound(ctx, q, rec, expected, prevSize > 0, deadline)
		if err != nil {
			return Round{}, err
		}
		rank := res.rankOf(m.cfg.ID)
		if rank < 0 {
			m.cfg.Logger.Info("elastic: left out of a round; waiting for the next", "round", q, "members", len(res.Members), "id", m.cfg.ID)
			if _, err := m.st.Add(ctx, keyWaiting, 1); err != nil {
				return Round{}, fmt.Errorf("elastic: announcing this member: %w", err)
			}
			prevSize = 0
			q++
			continue
		}
		r, err := m.form(ctx, res, rank, state)
		if err != nil {
			if ctx.Err() != nil {
				return Round{}, err
			}
			if time.Now().After(deadline) {
				return Round{}, fmt.Errorf("elastic: no round could be formed within %v (Config.JoinTimeout); the last attempt: %w", m.cfg.JoinTimeout, err)
			}
			m.cfg.Logger.Warn("elastic: round failed to form; trying the next", "round", q, "err", err)
			// Someone in it is gone; the rest meet in the next round.
			prevSize, prevWaiting = max(len(res.Members)-1, 1), res.Waiting
			q++
			continue
		}
		ev := Event{Round: r.Number, Size: r.Size, Reason: why.Error(), Detected: detected, Resumed: time.Now(),
			Step: m.progress.Step, Healed: r.Healed}
		m.events = append(m.events, ev)
		m.cfg.Logger.Info("elastic: round formed", "round", r.Number, "size", r.Size, "rank", r.Rank,
			"step", m.progress.Step, "healed", r.Healed, "reason", ev.Reason,
			"took", ev.Resumed.Sub(detected).Round(time.Millisecond), "members", strings.Join(r.Members, ","))
		return r, nil
	}
}

// form connects round res's process group and heals the members behind.
func (m *Manager) form(ctx context.Context, res *result, rank int, state State) (Round, error) {
	size := len(res.Members)
	perRank, lrScale, err := m.cfg.Batch.Batch(size)
	if err != nil {
		return Round{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout)
	defer cancel()
	opts := append([]comm.InitOption{
		comm.WithStore(store.NewPrefix(roundKey(res.Round, "pg"), m.st)),
		comm.WithRank(rank), comm.WithWorldSize(size), comm.WithoutDefault(),
		comm.WithPeerTimeout(m.cfg.PeerTimeout), comm.WithInitTimeout(m.cfg.ConnectTimeout),
	}, m.cfg.InitOptions...)
	opts = append(opts, comm.WithGroupOptions(comm.WithName("elastic-round-"+strconv.Itoa(res.Round)), comm.WithLogger(m.cfg.Logger)))
	pg, err := comm.Init(cctx, "env://", opts...)
	if err != nil {
		return Round{}, fmt.Errorf("elastic: round %d: connecting %d members: %w", res.Round, size, err)
	}
	// The state may take longer than connecting: its transfer is bounded
	// by the caller's context and the group's liveness (a member that
	// dies mid-transfer fails it within the peer timeout).
	healed, err := m.heal(ctx, pg, res, rank, state)
	if err != nil {
		pg.Abort(err)
		pg.Close()
		return Round{}, err
	}
	m.pg, m.res, m.fresh, m.dirty = pg, res, false, nil
	m.current.Store(int64(res.Round))
	m.live.Store(pg)
	m.rounds++
	m.round = Round{Number: res.Round, Group: pg, Rank: rank, Size: size, Members: res.ids(), Changed: true,
		Healed: healed, PerRank: perRank, Global: perRank * size, LRScale: lrScale}
	return m.round, nil
}

// healHeader travels ahead of the state.
type healHeader struct {
	Progress Progress
	Bytes    int64
	Err      string
}

// heal sends rank 0's state to the others when any member is behind or
// new, and reports whether this member loaded it.
func (m *Manager) heal(ctx context.Context, pg *comm.ProcessGroup, res *result, rank int, state State) (bool, error) {
	lead := res.Members[0]
	need := false
	for _, r := range res.Members {
		if r.Fresh || r.Step != lead.Step || r.Samples != lead.Samples {
			need = true
		}
	}
	if !need {
		return false, nil
	}
	var hdr healHeader
	var blob []byte
	if rank == 0 {
		hdr.Progress = m.progress
		b, err := state.MarshalState()
		if err != nil {
			hdr.Err = err.Error()
		}
		blob, hdr.Bytes = b, int64(len(b))
	}
	if err := comm.BroadcastObject(ctx, pg, &hdr, 0); err != nil {
		return false, fmt.Errorf("elastic: round %d: sending the state's header: %w", res.Round, err)
	}
	if hdr.Err != "" {
		return false, fmt.Errorf("elastic: round %d: rank 0 (%s) could not encode its state: %s", res.Round, lead.ID, hdr.Err)
	}
	if rank != 0 {
		blob = make([]byte, hdr.Bytes)
	}
	t := tensor.New(tensor.WithShape(len(blob)), tensor.WithBacking(blob))
	if err := pg.Broadcast(ctx, t, 0).Wait(ctx); err != nil {
		return false, fmt.Errorf("elastic: round %d: sending the state: %w", res.Round, err)
	}
	me := res.Members[rank]
	if rank == 0 || (!me.Fresh && me.Step == lead.Step && me.Samples == lead.Samples) {
		return false, nil
	}
	if err := state.UnmarshalState(blob); err != nil {
		return false, fmt.Errorf("elastic: round %d: %w", res.Round, err)
	}
	m.progress = hdr.Progress
	return true, nil
}

// Commit decides with the other members whether the step just run counts.
// stepErr is the step's error on this member (nil when it succeeded). It
// returns true when every member's step succeeded: apply the update
// (optimizer step) now; Progress has advanced by one step and the round's
// global batch. It returns false when the step must be discarded on every
// member alike: a member failed or was lost (the next Quorum forms a new
// round, and a member that committed where this one did not is healed
// there). The error is non-nil only when stepErr is this member's own
// failure rather than a lost peer (a bad input, a diverged loss): the
// others see a failed step and carry on without it if it stops.
func (m *Manager) Commit(ctx context.Context, stepErr error) (bool, error) {
	if m.pg == nil {
		return false, fmt.Errorf("%w: elastic: Commit before Quorum formed a round", errs.InvalidArgument)
	}
	var own error
	if stepErr != nil && !isPeerFault(stepErr) {
		own = stepErr
	}
	vote := []float64{0, float64(m.waiting.Load())}
	if stepErr != nil {
		vote[0] = 1
	}
	t := tensor.New(tensor.WithShape(2), tensor.WithBacking(vote))
	if err := m.pg.AllReduce(ctx, t, comm.Max).Wait(ctx); err != nil {
		m.markDirty(fmt.Errorf("commit of step %d failed: %w", m.progress.Step+1, firstNonNil(stepErr, err)))
		return false, own
	}
	if vote[0] > 0 {
		m.markDirty(fmt.Errorf("step %d failed on a member: %v", m.progress.Step+1, stepErr))
		return false, own
	}
	m.progress.Step++
	m.progress.Samples += int64(m.round.Global)
	if int64(vote[1]) > m.res.Waiting && (m.cfg.MaxSize == 0 || m.round.Size < m.cfg.MaxSize) {
		m.markDirty(fmt.Errorf("%d member(s) waiting to join", int64(vote[1])-m.res.Waiting))
	}
	return true, nil
}

func firstNonNil(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (m *Manager) markDirty(why error) {
	if m.dirty == nil {
		m.dirty, m.detectedAt = why, time.Now()
		m.cfg.Logger.Warn("elastic: round must change", "round", m.round.Number, "reason", why)
	}
}

// isPeerFault reports whether err is a lost, stopped or disconnected peer
// rather than this member's own failure.
func isPeerFault(err error) bool {
	return errors.Is(err, errs.PeerLost) || errors.Is(err, errs.Timeout) || errors.Is(err, errs.Closed)
}

// Finish marks the job done, so that members still waiting for a round
// stop (ErrFinished) instead of waiting out their join timeout.
func (m *Manager) Finish(ctx context.Context) error {
	if err := m.st.Set(ctx, keyDone, []byte(strconv.FormatInt(m.progress.Step, 10))); err != nil {
		return fmt.Errorf("elastic: marking the job done: %w", err)
	}
	return nil
}

// Close leaves the job: it closes the round's group (peers see this member
// gone) and stops watching. The store stays open.
func (m *Manager) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.stopWatch()
		<-m.watchDone
		if m.pg != nil {
			err = m.pg.Close()
		}
		m.st.Close()
	})
	return err
}
