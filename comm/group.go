package comm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// ProcessGroup is a set of ranks that run collectives together: the world
// (every rank of a transport) or a subgroup of it. All methods are safe for
// concurrent use, but collectives are matched across ranks by their order of
// issue: two goroutines issuing collectives on one group must be ordered
// with each other, or equal-shaped collectives can pair up differently on
// different ranks and nothing can detect it (builds with -race report it;
// see order.go). Ranks given to and returned by methods are ranks of this
// group; WorldRank and GroupRank translate.
type ProcessGroup struct {
	world   *world
	id      uint32 // group id, part of every tag
	name    string
	opts    options
	rank    int   // this rank in the group; -1 on a non-member handle
	members []int // group rank -> world rank
	index   map[int]int

	life context.Context // cancelled with the cause by Close or Abort
	kill context.CancelCauseFunc

	mu       sync.Mutex
	seq      uint32        // next collective's sequence number
	runq     []*job        // collectives issued and not yet started, in order
	running  bool          // the runner goroutine is alive
	busy     bool          // the runner is running a collective
	wake     chan struct{} // tells an idle runner that runq is not empty
	closed   bool
	inflight sync.WaitGroup
	p2pTails map[p2pKey]chan struct{} // tail of each point-to-point stream
	p2pSeq   map[p2pKey]uint32        // messages issued in each stream, for the flight recorder

	// flight is the group's flight recorder (nil when turned off).
	flight *flightRecorder

	// shared holds the segments of the group's shared tensors
	// (NewSharedTensor) not yet closed.
	sharedMu sync.Mutex
	shared   []*sharedSeg

	// stage is the group's staging segment for all-reduces (stage.go),
	// nil before the first or when stageOff says the group does not stage.
	stageMu  sync.Mutex
	stage    *stage
	stageOff bool

	// issued checks, under the race detector, that the goroutines issuing
	// collectives on the group are ordered (see order.go). It is written
	// before mu is taken, on purpose.
	issued issueOrder
}

// world is what every group on one transport shares.
type world struct {
	t    transport.Transport
	life context.Context
	kill context.CancelCauseFunc

	mu       sync.Mutex
	nextID   uint32 // lowest group id this rank may propose for a new group
	abortErr error
	// abortDone is closed when the transport's abort returns (nil before
	// an abort).
	abortDone <-chan struct{}
	groups    []*ProcessGroup // every group handle made on this world, for the flight record

	flightDir string       // where flight records are dumped
	logger    *slog.Logger // the world group's
	dumpMu    sync.Mutex   // one dump at a time
	// abortDump is the reason of the dump written when the world aborted
	// (nil before); redumped is set once the dump was written again with
	// the failed operation's error (see flightFailed).
	abortDump atomic.Pointer[string]
	redumped  atomic.Bool
}

// NewProcessGroup returns the world group over t: every rank of the transport,
// with the transport's ranks. Each rank calls it once with its own transport;
// the group owns t and closes it on Close. It does not communicate.
func NewProcessGroup(ctx context.Context, t transport.Transport, opts ...Option) (*ProcessGroup, error) {
	if t == nil {
		return nil, errorf(ErrInvalidArgument, "NewProcessGroup needs a transport, got nil")
	}
	if err := errs.CheckContext(ctx, "comm", "NewProcessGroup"); err != nil {
		return nil, err
	}
	if err := errs.FromContext(ctx, "comm: NewProcessGroup"); err != nil {
		return nil, err
	}
	n, r := t.Size(), t.Rank()
	if n < 1 || r < 0 || r >= n {
		return nil, errorf(ErrInvalidArgument, "transport reports rank %d of world size %d", r, n)
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if o.name == "" {
		o.name = "world"
	}
	if !o.debugSet || o.flightDir == "" {
		dbg, err := launch.DebugFromEnv()
		if err != nil {
			return nil, fmt.Errorf("comm: creating process group: %w", err)
		}
		if !o.debugSet {
			o.debug = dbg.Level
		}
		if o.flightDir == "" {
			o.flightDir = dbg.FlightDir
		}
	}
	if o.debug >= launch.DebugInfo && !o.loggerSet {
		o.logger = slog.Default()
	}
	w := &world{t: t, nextID: 1, flightDir: o.flightDir, logger: o.logger}
	w.life, w.kill = context.WithCancelCause(context.Background())
	members := make([]int, n)
	for i := range members {
		members[i] = i
	}
	pg := newGroup(w.life, w, 0, r, members, o)
	if o.debug >= launch.DebugInfo {
		w.dumpOnSignal() // ends with the world
	}
	return pg, nil
}

func newGroup(parent context.Context, w *world, id uint32, rank int, members []int, o options) *ProcessGroup {
	pg := &ProcessGroup{world: w, id: id, name: o.name, opts: o, rank: rank, members: members,
		index: make(map[int]int, len(members)), p2pTails: map[p2pKey]chan struct{}{}, p2pSeq: map[p2pKey]uint32{}, wake: make(chan struct{}, 1)}
	for g, wr := range members {
		pg.index[wr] = g
	}
	pg.life, pg.kill = context.WithCancelCause(parent)
	if rank >= 0 {
		pg.flight = newFlightRecorder(o.flightSize, o.debug >= launch.DebugDetail)
		if o.debug >= launch.DebugInfo {
			o.logger.Info("comm: process group created", "group", o.name, "id", id, "rank", rank, "size", len(members),
				"world_ranks", members, "debug", o.debug.String(), "flight_recorder", o.flightSize)
		}
		w.mu.Lock()
		w.groups = append(w.groups, pg)
		w.mu.Unlock()
	}
	return pg
}

// DebugLevel returns the group's debug level (WithDebugLevel, else
// TANDEM_DEBUG or TORCH_DISTRIBUTED_DEBUG), for layers above that log more
// at higher levels.
func (pg *ProcessGroup) DebugLevel() launch.DebugLevel { return pg.opts.debug }

// Logger returns the group's logger (WithLogger; slog.Default() at
// launch.DebugInfo and above when none was given; otherwise silent).
func (pg *ProcessGroup) Logger() *slog.Logger { return pg.opts.logger }

// Rank returns this process's rank in the group, or -1 on a handle for a
// group it is not a member of.
func (pg *ProcessGroup) Rank() int { return pg.rank }

// Size returns the number of ranks in the group.
func (pg *ProcessGroup) Size() int { return len(pg.members) }

// ID returns the group's id: 0 for the world, and for a subgroup a number
// that every member agrees on and that no other group of this world that
// shares a member uses. It is part of every message tag; layers above may use
// it to tell groups apart (for example in the hash of a graph op).
func (pg *ProcessGroup) ID() uint32 { return pg.id }

// Name returns the group's name (WithName; "world" for a world group).
func (pg *ProcessGroup) Name() string { return pg.name }

// IsMember reports whether this rank belongs to the group; every operation on
// a non-member handle fails with ErrNotMember.
func (pg *ProcessGroup) IsMember() bool { return pg.rank >= 0 }

// Ranks returns the world ranks of the group's members, in group rank order.
func (pg *ProcessGroup) Ranks() []int { return append([]int(nil), pg.members...) }

// WorldRank returns the world rank of the group's rank groupRank.
func (pg *ProcessGroup) WorldRank(groupRank int) (int, error) {
	if groupRank < 0 || groupRank >= len(pg.members) {
		return 0, errorf(ErrInvalidArgument, "group %q has ranks 0..%d, not %d", pg.name, len(pg.members)-1, groupRank)
	}
	return pg.members[groupRank], nil
}

// GroupRank returns the rank in this group of the world rank worldRank, or an
// error wrapping ErrInvalidArgument when that rank is not a member.
func (pg *ProcessGroup) GroupRank(worldRank int) (int, error) {
	g, ok := pg.index[worldRank]
	if !ok {
		return 0, errorf(ErrInvalidArgument, "world rank %d is not a member of group %q (members %v)", worldRank, pg.name, pg.members)
	}
	return g, nil
}

// Close ends the group: operations still in flight fail with ErrClosed, later
// calls fail with ErrClosed. Closing the world group closes the transport and
// with it every subgroup; closing a subgroup leaves the world untouched. Close
// waits (a bounded time) for the group's operations to end. Close is meant to
// be called once every rank finished its work with the group; closing the
// world while peers still talk to this rank makes their operations fail with
// ErrPeerLost. Calling Close again returns nil.
func (pg *ProcessGroup) Close() error {
	pg.mu.Lock()
	if pg.closed {
		pg.mu.Unlock()
		return nil
	}
	pg.closed = true
	pg.mu.Unlock()
	if pg.id != 0 {
		pg.world.mu.Lock()
		if i := slices.Index(pg.world.groups, pg); i >= 0 {
			pg.world.groups = slices.Delete(pg.world.groups, i, i+1)
		}
		pg.world.mu.Unlock()
	}
	pg.kill(fmt.Errorf("comm: process group %q was closed: %w", pg.name, ErrClosed))
	var err error
	if pg.id == 0 {
		pg.world.kill(fmt.Errorf("comm: process group %q was closed: %w", pg.name, ErrClosed))
		pg.world.waitAbort()
		err = pg.world.t.Close()
	}
	done := make(chan struct{})
	go func() { pg.inflight.Wait(); close(done) }()
	select {
	case <-done:
		pg.releaseStage()
	case <-time.After(closeGrace):
		// The staging segment stays mapped: an operation may still read it.
		err = errors.Join(err, fmt.Errorf("comm: close: group %q: operations still running after %v: %w", pg.name, closeGrace, ErrTimeout))
	}
	return err
}

// closeGrace bounds how long Close waits for operations to end.
const closeGrace = 30 * time.Second

// Abort fails every operation in flight and every later one with an error
// wrapping cause, and aborts the transport, so that every peer's operations
// involving this rank fail with ErrPeerLost instead of waiting for their
// deadlines. It affects the whole world (every group on the transport), since
// they share it. A nil cause means "aborted by the user" (ErrClosed).
func (pg *ProcessGroup) Abort(cause error) {
	if cause == nil {
		cause = fmt.Errorf("comm: process group %q aborted by its owner: %w", pg.name, ErrClosed)
	}
	pg.world.abort(cause)
}

func (w *world) abort(cause error) {
	if done := w.startAbort(cause); done != nil {
		<-done
	}
}

// startAbort records cause, dumps the flight record, fails every operation
// and starts the transport's abort; it returns a channel closed when that
// abort returns, or nil when the world had aborted already.
func (w *world) startAbort(cause error) <-chan struct{} {
	w.mu.Lock()
	if w.abortErr != nil {
		w.mu.Unlock()
		return nil
	}
	w.abortErr = cause
	w.mu.Unlock()
	// The record as it stands when the world breaks: the operation that
	// failed, and those in flight on every group.
	reason := "abort: " + cause.Error()
	if _, err := w.dumpFlight(reason); err != nil {
		w.logger.Warn("comm: could not dump the flight record", "err", err)
	}
	w.abortDump.Store(&reason)
	w.kill(cause)
	done := make(chan struct{})
	w.mu.Lock()
	w.abortDone = done
	w.mu.Unlock()
	go func() {
		defer close(done)
		w.t.Abort(cause)
	}()
	return done
}

// waitAbort waits for a transport abort started by startAbort, if any.
func (w *world) waitAbort() {
	w.mu.Lock()
	done := w.abortDone
	w.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (w *world) aborted() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.abortErr
}

// usable returns why no new operation can start on the group, or nil.
func (pg *ProcessGroup) usable(desc string) error {
	if pg.rank < 0 {
		return fmt.Errorf("%s on group %q: %w", desc, pg.name, ErrNotMember)
	}
	if err := pg.world.aborted(); err != nil {
		return fmt.Errorf("%s on group %q: the group was aborted earlier: %w", desc, pg.name, err)
	}
	if pg.life.Err() != nil {
		return fmt.Errorf("%s on group %q: %w", desc, pg.name, context.Cause(pg.life))
	}
	return nil
}

func (pg *ProcessGroup) checkPeer(peer int, what string) error {
	if peer < 0 || peer >= len(pg.members) {
		return errorf(ErrInvalidArgument, "%s %d is not a rank of group %q (size %d)", what, peer, pg.name, len(pg.members))
	}
	return nil
}

// errorf returns an error wrapping sentinel whose text follows it.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("comm: %s: %w", fmt.Sprintf(format, args...), sentinel)
}

// PeerFailure returns the transport's account of the first member of the
// group whose link has failed (a crashed, aborted, unresponsive or
// disconnected peer; wrapping ErrPeerLost), or nil while every link is up
// or the backend cannot tell. It does not block. A caller that cannot use
// the group once any member is gone (package elastic) polls it to abort at
// once, rather than when its next operation happens to involve that peer.
func (pg *ProcessGroup) PeerFailure() error {
	if pg.rank < 0 {
		return nil
	}
	me := pg.members[pg.rank]
	for _, r := range pg.members {
		if r == me {
			continue
		}
		if err := pg.world.peerLost(r); err != nil {
			return err
		}
	}
	return nil
}
