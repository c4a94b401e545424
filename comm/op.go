package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// collective describes one collective call: its fingerprint, what it does on
// this rank, and whether its arguments were valid here.
type collective struct {
	name    string // "all_reduce"
	desc    string // fingerprint text: "all_reduce(float32,[4],sum)"
	invalid error  // this rank's arguments are unusable (wraps ErrInvalidArgument)
	// unchecked collectives skip the fingerprint exchange and never abort
	// the group (the monitored barrier, whose point is to survive absent
	// ranks).
	unchecked bool
	run       func(ctx context.Context, c *opCtx) error
	// oneBuffer, when not nil, says whether the collective is a reduction
	// that fits one buffer of the group's staging segment st, and what it
	// reduces there: such a collective runs with its fingerprint check in
	// the segment instead of the transport (stagecheck.go).
	oneBuffer func(st *stage) (oneBuffer, bool)
}

// opCtx is what an algorithm needs: the group, its collective's sequence
// number, and tagged send/recv in group ranks.
type opCtx struct {
	pg  *ProcessGroup
	seq uint32
}

func (c *opCtx) rank() int { return c.pg.rank }
func (c *opCtx) size() int { return len(c.pg.members) }

func (c *opCtx) tag(step uint16) transport.Tag { return collectiveTag(c.pg.id, c.seq, step) }

func (c *opCtx) send(ctx context.Context, peer int, step uint16, b []byte) error {
	if err := c.pg.world.t.Send(ctx, c.pg.members[peer], c.tag(step), b); err != nil {
		return fmt.Errorf("sending %d bytes to rank %d: %w", len(b), peer, err)
	}
	return nil
}

func (c *opCtx) recv(ctx context.Context, peer int, step uint16, b []byte) error {
	if err := c.pg.world.t.Recv(ctx, c.pg.members[peer], c.tag(step), b); err != nil {
		return fmt.Errorf("receiving %d bytes from rank %d: %w", len(b), peer, err)
	}
	return nil
}

// job is a collective waiting for its turn on the group's runner.
type job struct {
	ctx   context.Context
	op    collective
	seq   uint32
	w     *work
	ord   uint64      // the job's record in the group's flight recorder
	taken atomic.Bool // claimed by the runner, or failed while queued
	// unwatch stops the watch on ctx that fails the job should its
	// context end while it is still queued; nil when there is none.
	unwatch func() bool
}

// start issues a collective: it takes the group's next sequence number and
// queues the collective for the group's runner, a goroutine that runs the
// group's collectives one after the other in sequence order. The runner
// lives as long as the group, so a collective costs no goroutine start (and
// no stack growth) of its own.
func (pg *ProcessGroup) start(ctx context.Context, op collective) Work {
	if err := errs.CheckContext(ctx, "comm", op.desc); err != nil {
		return failedWork(op.desc, err)
	}
	pg.issued.note()
	if err := pg.usable(op.desc); err != nil {
		return failedWork(op.desc, err)
	}
	pg.mu.Lock()
	if pg.closed {
		pg.mu.Unlock()
		return failedWork(op.desc, fmt.Errorf("%s on group %q: %w", op.desc, pg.name, context.Cause(pg.life)))
	}
	seq := pg.seq
	pg.seq++
	w := newWork(op.desc)
	w.seq, w.group = int64(seq), pg.name
	j := &job{ctx: ctx, op: op, seq: seq, w: w, ord: pg.flight.record(seq, &op)}
	pg.inflight.Add(1)
	if (pg.busy || len(pg.runq) > 0) && ctx.Done() != nil {
		// Queued behind another collective: should ctx end first, the
		// collective fails at once (and aborts the group, since the ranks
		// can no longer agree on what runs) instead of waiting its turn.
		j.unwatch = context.AfterFunc(ctx, func() { pg.expire(j) })
	}
	pg.runq = append(pg.runq, j)
	switch {
	case !pg.running:
		pg.running = true
		go pg.runner()
	default:
		select {
		case pg.wake <- struct{}{}:
		default:
		}
	}
	pg.mu.Unlock()
	return w
}

// runner runs the group's queued collectives in order until the group's
// life ends and nothing is left to run.
func (pg *ProcessGroup) runner() {
	for {
		pg.mu.Lock()
		for len(pg.runq) == 0 {
			pg.busy = false
			if pg.life.Err() != nil {
				pg.running = false
				pg.mu.Unlock()
				return
			}
			pg.mu.Unlock()
			select {
			case <-pg.wake:
			case <-pg.life.Done():
			}
			pg.mu.Lock()
		}
		j := pg.runq[0]
		pg.runq[0] = nil
		pg.runq = pg.runq[1:]
		if len(pg.runq) == 0 {
			pg.runq = pg.runq[:0:0]
		}
		pg.busy = true
		pg.mu.Unlock()
		if !j.taken.CompareAndSwap(false, true) {
			continue // its context ended while it was queued
		}
		if j.unwatch != nil {
			j.unwatch()
		}
		pg.flight.started(j.ord)
		var t0 time.Time
		if pg.opts.debug >= launch.DebugDetail {
			t0 = time.Now()
		}
		err := pg.execute(j.ctx, j.op, j.seq)
		pg.flight.ended(j.ord, err)
		if err != nil {
			pg.world.flightFailed()
		}
		if pg.opts.debug >= launch.DebugDetail {
			pg.opts.logger.Info("comm: collective", "group", pg.name, "rank", pg.rank, "seq", j.seq, "op", j.op.desc,
				"took", time.Since(t0), "err", err)
		}
		j.w.finish(err)
		pg.inflight.Done()
	}
}

// expire fails a queued collective whose context ended before its turn.
func (pg *ProcessGroup) expire(j *job) {
	if !j.taken.CompareAndSwap(false, true) {
		return
	}
	pg.mu.Lock()
	if i := slices.Index(pg.runq, j); i >= 0 {
		pg.runq = slices.Delete(pg.runq, i, i+1)
	}
	pg.mu.Unlock()
	label := fmt.Sprintf("%s #%d on group %q (rank %d)", j.op.desc, j.seq, pg.name, pg.rank)
	err := fmt.Errorf("still queued behind the previous collective: %w", j.ctx.Err())
	pg.flight.ended(j.ord, err)
	j.w.finish(pg.fail(j.ctx, label, err))
	pg.inflight.Done()
}

// opContext bounds an operation by ctx, by the group's default timeout when
// ctx has no deadline, and by the group's life. stop cancels the operation
// with a cause; release frees the context's resources.
func (pg *ProcessGroup) opContext(ctx context.Context) (opCtx context.Context, stop context.CancelCauseFunc, release func()) {
	var cancelT context.CancelFunc
	if _, ok := ctx.Deadline(); !ok {
		ctx, cancelT = context.WithTimeout(ctx, pg.opts.timeout)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	unlife := context.AfterFunc(pg.life, func() { cancel(context.Cause(pg.life)) })
	return ctx, cancel, func() {
		unlife()
		cancel(nil)
		if cancelT != nil {
			cancelT()
		}
	}
}

// label names collective op, number seq, in errors.
func (pg *ProcessGroup) label(op collective, seq uint32) string {
	return fmt.Sprintf("%s #%d on group %q (rank %d)", op.desc, seq, pg.name, pg.rank)
}

// errStoppedByFingerprint is the cause with which a collective's algorithm
// is stopped when the fingerprint check failed meanwhile.
var errStoppedByFingerprint = errors.New("comm: stopped: the fingerprint check failed")

// A collective runs in three parts. First this rank's fingerprint goes to
// every other member (small messages that the transport buffers on arrival,
// so sending them never waits for the peers). Then the algorithm runs. Then
// the peers' fingerprints are received (by now they have usually arrived)
// and compared, so that no rank reports success for a mismatched
// collective. Should the algorithm take longer than fingerprintGrace, the
// check runs beside it instead and stops it on a mismatch, so that
// collectives that disagree (and would wait for each other's messages
// forever) fail at once.
func (pg *ProcessGroup) execute(userCtx context.Context, op collective, seq uint32) error {
	if err := pg.usable(op.desc); err != nil {
		return err
	}
	c := &opCtx{pg: pg, seq: seq}
	if !op.unchecked && op.oneBuffer != nil && op.invalid == nil && len(pg.members) > 1 {
		if st := pg.mappedStage(); st != nil {
			if one, ok := op.oneBuffer(st); ok {
				return pg.executeInStage(userCtx, c, op, st, one)
			}
		}
	}
	ctx, stop, release := pg.opContext(userCtx)
	defer release()
	// label names the collective in errors; built only when one occurs.
	label := func() string { return pg.label(op, seq) }
	if op.unchecked {
		if err := op.run(ctx, c); err != nil {
			if pg.life.Err() != nil {
				return fmt.Errorf("%s: %w", label(), context.Cause(pg.life))
			}
			return fmt.Errorf("%s: %w", label(), err)
		}
		return nil
	}
	if len(pg.members) == 1 {
		if op.invalid != nil {
			return fmt.Errorf("%s: %w", label(), op.invalid)
		}
		if err := op.run(ctx, c); err != nil {
			return pg.fail(ctx, label(), err)
		}
		return nil
	}

	frame := encodeFingerprint(seq, op)
	if err := pg.sendFingerprints(ctx, c, op, frame); err != nil {
		return pg.fail(ctx, label(), err)
	}
	if op.invalid != nil {
		// Take the peers' fingerprints (they learn of this rank's invalid
		// arguments from its own), then fail with this rank's reason.
		_ = pg.recvFingerprints(ctx, c, op, frame)
		return fmt.Errorf("%s: %w", label(), op.invalid)
	}
	if op.run == nil {
		// Nothing but the fingerprint exchange (a barrier).
		switch err := pg.recvFingerprints(ctx, c, op, frame); {
		case err != nil && errors.Is(err, ErrMismatch):
			return err
		case err != nil:
			return pg.fail(ctx, label(), err)
		}
		return nil
	}
	check := pg.watchFingerprints(ctx, stop, c, op, frame)
	algErr := op.run(ctx, c)
	stoppedByFingerprint := errors.Is(context.Cause(ctx), errStoppedByFingerprint)
	failCtx := ctx
	if stoppedByFingerprint {
		// The collective's own deadline has not passed: errors must not
		// read as timeouts.
		failCtx = context.WithoutCancel(ctx)
	}
	if algErr != nil && !isDisagreement(algErr) && !stoppedByFingerprint {
		if ctx.Err() != nil {
			// The deadline expired. The fingerprint check, bounded by the
			// same context, knows which rank never joined: prefer its word.
			fpErr := check.result()
			switch {
			case fpErr != nil && errors.Is(fpErr, ErrMismatch):
				return fpErr
			case fpErr != nil:
				return pg.fail(ctx, label(), fpErr)
			}
			return pg.fail(ctx, label(), algErr)
		}
		// A lost peer. It may have left because it found this collective
		// mismatched: the fingerprint it sent before its data tells, and
		// is still there to be read. Look briefly, then abort, so that the
		// fingerprint check (and every peer) stops waiting.
		fpErr, mine := check.quick(fingerprintDrain)
		err := pg.fail(ctx, label(), algErr)
		if !mine {
			fpErr = check.abandon()
		}
		if fpErr != nil && errors.Is(fpErr, ErrMismatch) {
			return fpErr
		}
		return err
	}
	fpErr := check.result()
	switch {
	case fpErr != nil && errors.Is(fpErr, ErrMismatch):
		return fpErr
	case fpErr != nil:
		return pg.fail(failCtx, label(), fpErr)
	case algErr != nil:
		return fmt.Errorf("%s: %w", label(), algErr)
	}
	return nil
}

// peerErrors is implemented by transports that can say why the link to a
// peer failed (comm/tcp's, which fails a peer that stays silent for its
// peer timeout as unresponsive).
type peerErrors interface {
	PeerError(rank int) error
}

// peerLost returns the transport's error for the link to world rank r when
// that link failed (wrapping ErrPeerLost), else nil.
func (w *world) peerLost(r int) error {
	pe, ok := w.t.(peerErrors)
	if !ok {
		return nil
	}
	if err := pe.PeerError(r); err != nil && errors.Is(err, ErrPeerLost) {
		return err
	}
	return nil
}

// isDisagreement reports errors that mean the ranks disagree (or the caller
// erred) rather than that the group broke: these fail the collective without
// aborting the group.
func isDisagreement(err error) bool {
	return errors.Is(err, ErrMismatch) || errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrTooLarge) ||
		// A shared mapping another member's collective cut short: the
		// fingerprints say why, and the group stays whole (mapShared).
		errors.Is(err, errMapCutShort)
}

// fail turns an algorithm's error into the collective's error and, when the
// group broke (a lost peer, an expired deadline), aborts the group so every
// rank stops waiting.
func (pg *ProcessGroup) fail(ctx context.Context, label string, err error) error {
	if isDisagreement(err) {
		return fmt.Errorf("%s: %w", label, err)
	}
	if pg.life.Err() != nil {
		cause := context.Cause(pg.life)
		if !errors.Is(err, cause) {
			return fmt.Errorf("%s: %w", label, cause)
		}
		return fmt.Errorf("%s: %w", label, err)
	}
	out := errs.Wrap(ctx, label, err)
	pg.opts.logger.Warn("comm: collective failed; aborting the process group", "group", pg.name, "rank", pg.rank, "err", out)
	pg.world.abort(out)
	return out
}
