package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/tandemml/tandem/comm/transport"
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

// start issues a collective: it takes the group's next sequence number and
// runs the collective in its own goroutine once the group's previous
// collective on this rank has finished.
func (pg *ProcessGroup) start(ctx context.Context, op collective) Work {
	if ctx == nil {
		ctx = context.Background()
	}
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
	prev := pg.tail
	w := newWork(op.desc)
	w.seq, w.group = int64(seq), pg.name
	pg.tail = w.done
	pg.inflight.Add(1)
	pg.mu.Unlock()
	go func() {
		defer pg.inflight.Done()
		w.finish(pg.execute(ctx, op, seq, prev))
	}()
	return w
}

// opContext bounds an operation by ctx, by the group's default timeout when
// ctx has no deadline, and by the group's life.
func (pg *ProcessGroup) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var cancelT context.CancelFunc = func() {}
	if _, ok := ctx.Deadline(); !ok {
		ctx, cancelT = context.WithTimeout(ctx, pg.opts.timeout)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(pg.life, func() { cancel(context.Cause(pg.life)) })
	return ctx, func() { stop(); cancel(nil); cancelT() }
}

func (pg *ProcessGroup) execute(userCtx context.Context, op collective, seq uint32, prev chan struct{}) error {
	ctx, cancel := pg.opContext(userCtx)
	defer cancel()
	// label names the collective in errors; built only when one occurs.
	label := func() string { return fmt.Sprintf("%s #%d on group %q (rank %d)", op.desc, seq, pg.name, pg.rank) }
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return pg.fail(ctx, label(), fmt.Errorf("still queued behind the previous collective: %w", ctx.Err()))
		}
	}
	if err := pg.usable(op.desc); err != nil {
		return err
	}
	c := &opCtx{pg: pg, seq: seq}
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

	// The fingerprint exchange runs beside the algorithm: it costs no extra
	// round trip, and since it completes on a rank only once every member's
	// fingerprint arrived, no rank reports success for a mismatched collective.
	algCtx, cancelAlg := context.WithCancel(ctx)
	defer cancelAlg()
	frame := encodeFingerprint(seq, op)
	fpDone := make(chan error, 1)
	go func() {
		err := pg.exchangeFingerprints(ctx, c, op, frame)
		if err != nil {
			cancelAlg()
		}
		fpDone <- err
	}()
	if op.invalid != nil {
		<-fpDone // tell the peers, then fail here with this rank's own reason
		return fmt.Errorf("%s: %w", label(), op.invalid)
	}
	var algErr error
	if op.run != nil {
		algErr = op.run(algCtx, c)
	}
	stoppedByFingerprint := algCtx.Err() != nil && ctx.Err() == nil
	if algErr != nil && !isDisagreement(algErr) && !stoppedByFingerprint {
		if ctx.Err() != nil {
			// The deadline expired. The fingerprint exchange, bounded by the
			// same context, knows which rank never joined: prefer its word.
			fpErr := <-fpDone
			switch {
			case fpErr != nil && errors.Is(fpErr, ErrMismatch):
				return fpErr
			case fpErr != nil:
				return pg.fail(ctx, label(), fpErr)
			}
			return pg.fail(ctx, label(), algErr)
		}
		// A lost peer: abort first, so that the fingerprint exchange (and
		// every peer) stops waiting.
		err := pg.fail(ctx, label(), algErr)
		<-fpDone
		return err
	}
	fpErr := <-fpDone
	switch {
	case fpErr != nil && errors.Is(fpErr, ErrMismatch):
		return fpErr
	case fpErr != nil:
		return pg.fail(ctx, label(), fpErr)
	case algErr != nil:
		return fmt.Errorf("%s: %w", label(), algErr)
	}
	return nil
}

// isDisagreement reports errors that mean the ranks disagree (or the caller
// erred) rather than that the group broke: these fail the collective without
// aborting the group.
func isDisagreement(err error) bool {
	return errors.Is(err, ErrMismatch) || errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrTooLarge)
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
	var out error
	switch {
	case ctx.Err() != nil && !errors.Is(err, ErrTimeout) && !errors.Is(err, ctx.Err()):
		out = fmt.Errorf("%w: %s: %w: %w", ErrTimeout, label, err, ctx.Err())
	case ctx.Err() != nil && !errors.Is(err, ErrTimeout):
		out = fmt.Errorf("%w: %s: %w", ErrTimeout, label, err)
	default:
		out = fmt.Errorf("%s: %w", label, err)
	}
	pg.opts.logger.Warn("comm: collective failed; aborting the process group", "group", pg.name, "rank", pg.rank, "err", out)
	pg.world.abort(out)
	return out
}
