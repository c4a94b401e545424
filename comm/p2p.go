package comm

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// P2PKind says whether a P2POp sends or receives.
type P2PKind uint8

// The point-to-point kinds.
const (
	P2PSend P2PKind = iota + 1
	P2PRecv
)

// P2POp is one send or receive of BatchISendIRecv.
type P2POp struct {
	Kind   P2PKind
	Tensor *tensor.Dense
	Peer   int // group rank of the destination (send) or source (receive)
	Tag    int
}

// SendOp returns the P2POp that sends t to dst under tag.
func SendOp(t *tensor.Dense, dst, tag int) P2POp {
	return P2POp{Kind: P2PSend, Tensor: t, Peer: dst, Tag: tag}
}

// RecvOp returns the P2POp that receives into t from src under tag.
func RecvOp(t *tensor.Dense, src, tag int) P2POp {
	return P2POp{Kind: P2PRecv, Tensor: t, Peer: src, Tag: tag}
}

// p2pKey names one ordered stream of point-to-point messages.
type p2pKey struct {
	kind P2PKind
	peer int
	tag  int
}

// Send sends t's data to rank dst of the group under tag (0 <= tag < 2^48)
// and returns once t may be reused. The receiver's tensor must have the same
// size in bytes. Messages between two ranks under one tag arrive in the order
// they were sent; point-to-point traffic never mixes with collectives or with
// other groups' messages, and does not wait for this group's collectives.
func (pg *ProcessGroup) Send(ctx context.Context, t *tensor.Dense, dst, tag int) error {
	return waitOwn(ctx, pg.ISend(ctx, t, dst, tag))
}

// Recv receives into t the next message that rank src sent under tag. A
// message of another size fails with ErrMismatch.
func (pg *ProcessGroup) Recv(ctx context.Context, t *tensor.Dense, src, tag int) error {
	return waitOwn(ctx, pg.IRecv(ctx, t, src, tag))
}

// ownGrace bounds how long waitOwn waits, once ctx has ended, for the
// operation that ctx also governs to notice and finish.
const ownGrace = time.Second

// waitOwn waits for w, an operation started under ctx. When ctx ends first,
// the operation ends with it: waitOwn lets it finish (for at most ownGrace),
// so that when a blocking Send or Recv returns, the operation's outcome is
// settled (its flight record, its logs, its buffers no longer in use) and
// reported as the operation saw it.
func waitOwn(ctx context.Context, w Work) error {
	err := w.Wait(ctx)
	if err == nil || ctx == nil || ctx.Err() == nil { // a nil ctx is refused by Wait
		return err
	}
	t := time.NewTimer(ownGrace)
	defer t.Stop()
	select {
	case <-w.Done():
		return w.Err()
	case <-t.C:
		return err
	}
}

// ISend is Send returning at once; t must not change until the Work is done.
func (pg *ProcessGroup) ISend(ctx context.Context, t *tensor.Dense, dst, tag int) Work {
	return pg.p2p(ctx, SendOp(t, dst, tag))
}

// IRecv is Recv returning at once; t holds the message once the Work is done.
func (pg *ProcessGroup) IRecv(ctx context.Context, t *tensor.Dense, src, tag int) Work {
	return pg.p2p(ctx, RecvOp(t, src, tag))
}

// BatchISendIRecv starts every op at once and returns a Work that completes
// when all have (with the first error). Sends and receives of one batch run
// concurrently, so a batch in which every rank sends to its right and receives
// from its left cannot deadlock.
func (pg *ProcessGroup) BatchISendIRecv(ctx context.Context, ops []P2POp) Work {
	parts := make([]*work, len(ops))
	for i, op := range ops {
		parts[i] = pg.p2p(ctx, op)
	}
	return joinWork(fmt.Sprintf("batch of %d point-to-point ops on group %q", len(ops), pg.name), parts)
}

func (pg *ProcessGroup) p2p(ctx context.Context, op P2POp) *work {
	verb, dir := "send", "to"
	if op.Kind == P2PRecv {
		verb, dir = "recv", "from"
	}
	desc := fmt.Sprintf("%s %s rank %d tag %d on group %q", verb, dir, op.Peer, op.Tag, pg.name)
	if err := errs.CheckContext(ctx, "comm", desc); err != nil {
		return failedWork(desc, err)
	}
	if op.Kind != P2PSend && op.Kind != P2PRecv {
		return failedWork(desc, errorf(ErrInvalidArgument, "%s: P2POp kind %d is neither P2PSend nor P2PRecv", desc, op.Kind))
	}
	if err := pg.usable(desc); err != nil {
		return failedWork(desc, err)
	}
	buf, err := tensorBuffer(op.Tensor, verb+" tensor")
	if err == nil {
		err = pg.checkPeer(op.Peer, "peer")
	}
	if err == nil && (op.Tag < 0 || op.Tag > maxUserTag) {
		err = errorf(ErrInvalidArgument, "tag %d is outside 0..2^48-1", op.Tag)
	}
	if err != nil {
		return failedWork(desc, fmt.Errorf("%s: %w", desc, err))
	}
	key := p2pKey{op.Kind, op.Peer, op.Tag}
	w := newWork(desc)
	pg.mu.Lock()
	if pg.closed {
		pg.mu.Unlock()
		return failedWork(desc, fmt.Errorf("%s: %w", desc, context.Cause(pg.life)))
	}
	prev := pg.p2pTails[key]
	pg.p2pTails[key] = w.done
	seq := pg.p2pSeq[key]
	pg.p2pSeq[key] = seq + 1
	// Recorded under pg.mu, so that the stream's records are in its order.
	ord := pg.flight.recordP2P(verb, fmt.Sprintf("%s(%v,%s,%s=%d,tag=%d)", verb, buf.dt, shapeString(buf.shape), dir, op.Peer, op.Tag), seq, op.Peer, op.Tag)
	pg.inflight.Add(1)
	pg.mu.Unlock()
	go func() {
		defer pg.inflight.Done()
		t0 := time.Now()
		err := pg.runP2P(ctx, op, buf.b, prev, ord)
		if err != nil {
			err = fmt.Errorf("%s: %w", desc, err)
		}
		pg.flight.ended(ord, err)
		if pg.opts.debug >= launch.DebugDetail {
			pg.opts.logger.Info("comm: point-to-point", "group", pg.name, "rank", pg.rank, "op", verb, "peer", op.Peer, "tag", op.Tag,
				"seq", seq, "bytes", len(buf.b), "took", time.Since(t0), "err", err)
		}
		pg.mu.Lock()
		if pg.p2pTails[key] == w.done {
			delete(pg.p2pTails, key)
		}
		pg.mu.Unlock()
		w.finish(err)
	}()
	return w
}

func (pg *ProcessGroup) runP2P(userCtx context.Context, op P2POp, b []byte, prev chan struct{}, ord uint64) error {
	ctx, _, release := pg.opContext(userCtx)
	defer release()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return pg.p2pError(ctx, errs.FromContext(ctx, "waiting for the stream's previous message"))
		}
	}
	pg.flight.started(ord)
	t, peer, tag := pg.world.t, pg.members[op.Peer], p2pTag(pg.id, op.Tag)
	var err error
	if op.Kind == P2PSend {
		err = t.Send(ctx, peer, tag, b)
	} else {
		err = t.Recv(ctx, peer, tag, b)
	}
	if err != nil {
		return pg.p2pError(ctx, err)
	}
	return nil
}

// p2pError classifies a point-to-point failure. Unlike collectives, a failed
// point-to-point message does not abort the group: it leaves no other rank
// half-way through a protocol.
func (pg *ProcessGroup) p2pError(ctx context.Context, err error) error {
	if pg.life.Err() != nil {
		return context.Cause(pg.life)
	}
	return errs.Annotate(ctx, err)
}
