package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Collectives checked in the staging segment.
//
// A reduction small enough for one staging buffer (an all-reduce below the
// ring threshold: reduceTo's one-buffer path) takes microseconds, and
// sending its fingerprint through the transport and receiving the peers'
// cost several times that: a message a peer, a reader to wake and a
// receive to match (two ranks on two cores: 4 KiB in 40 µs with the
// exchange, 8 µs without). Once the group's staging segment is mapped,
// such a collective carries its fingerprint in the segment instead: each
// rank writes its frame into its region next to the buffer it stages
// into, before it arrives at the barrier, and after the barrier compares
// every peer's frame with its own. Ranks that agree exchange no message
// at all.
//
// Every rank that calls the same collective takes this path (the choice
// depends on the description, which the frame holds, and on the segment,
// which every member maps in the same collective), so the other paths
// only meet it when ranks disagree:
//
//   - every rank stages its frame: after the barrier each sees the same
//     frames (no rank rewrites the buffer's frame before all have left
//     it), so all of them find the mismatch, and all exchange their frames
//     through the transport, as every other collective does, for the same
//     error on every rank;
//   - some rank runs a collective that goes through the transport (or has
//     invalid arguments): it sent its frame to every peer first. A rank
//     that waits at the barrier for longer than fingerprintGrace starts
//     receiving the peers' frames beside the wait; once one arrives it
//     stops waiting, sends its own frame to every peer and receives the
//     rest, which ends in the mismatch error on every rank. Should the
//     other rank's collective reach barrier 1 of the same sequence number
//     in the segment (a staged collective of another kind), its frame
//     there is stale (an earlier collective's sequence number), which the
//     first case covers.

// oneBuffer is a reduction of b in one staging buffer: prepare (when not
// nil) runs on b before it is staged, comb reduces the staged parts into
// every rank's b.
type oneBuffer struct {
	b       []byte
	comb    combiner
	prepare func()
}

// The frames fit in the region's header after its words.
var _ [stageHeader - stageFinger - stageBuffers*fingerprintSize]struct{}

// errPeerFingerprint stops the barrier of a collective checked in the
// segment when a peer's fingerprint arrived through the transport.
var errPeerFingerprint = errors.New("comm: a peer sent its fingerprint through the transport")

// mappedStage returns the group's staging segment when it is mapped, else
// nil.
func (pg *ProcessGroup) mappedStage() *stage {
	if !pg.opts.staging {
		return nil
	}
	pg.stageMu.Lock()
	defer pg.stageMu.Unlock()
	return pg.stage
}

// executeInStage runs op, a reduction in one buffer of st, with its
// fingerprint check in the segment (see above). Its context, bounded as
// opContext bounds every collective's, is only built should a wait sleep
// or something fail: a collective that finishes while its waits poll
// allocates next to nothing, and leaves nothing for the collector to take.
func (pg *ProcessGroup) executeInStage(userCtx context.Context, c *opCtx, op collective, st *stage, one oneBuffer) error {
	n, r := c.size(), c.rank()
	seq := st.extend(c.seq)
	i := int(seq % stageBuffers)
	w := &frameWatch{c: c, st: st}
	w.ctx.pg, w.ctx.user = pg, userCtx
	defer w.stop()
	if err := st.begin(&w.ctx, c, st.spinOne, seq, 1<<i); err != nil {
		return pg.fail(&w.ctx, pg.label(op, c.seq), err)
	}
	mine := st.finger(r, i)
	encodeFingerprintInto(mine, c.seq, op)
	if one.prepare != nil {
		one.prepare()
	}
	b := one.b
	copyCached(st.buffer(r, i)[:len(b)], b)
	err := st.barrierWatched(&w.ctx, c, st.spinOne, seq, 1, w.poll)
	switch {
	case err == nil && w.arrived.Load() == 0 && st.framesAgree(c, i, mine):
		parts := st.parts(n)
		for p := range parts {
			parts[p] = st.buffer(p, i)[:len(b)]
		}
		one.comb.whole(b, parts)
		st.end(r)
		return nil
	case err == nil, errors.Is(err, errPeerFingerprint):
		// The ranks disagree: settle it through the transport.
	default:
		st.end(r)
		return pg.fail(&w.ctx, pg.label(op, c.seq), err)
	}
	mine = append([]byte(nil), mine...)
	st.end(r)
	ctx := &w.ctx
	if err := pg.sendFingerprints(ctx, c, op, mine); err != nil {
		return pg.fail(ctx, pg.label(op, c.seq), err)
	}
	frames, have := w.collect(n)
	switch err := pg.recvFingerprintsHaving(ctx, c, op, mine, frames, have); {
	case err != nil && errors.Is(err, ErrMismatch):
		return err
	case err != nil:
		return pg.fail(ctx, pg.label(op, c.seq), err)
	}
	// Every rank called this collective, yet some rank ran it through the
	// transport: the ranks' states have drifted apart.
	return pg.fail(ctx, pg.label(op, c.seq), fmt.Errorf("a peer ran this collective through the transport, this rank in the staging segment (do all ranks run the same Tandem with the same options?)"))
}

// parts returns a slice of n parts for a reduction, reused by the group's
// collectives (which run one at a time).
func (s *stage) parts(n int) [][]byte {
	if cap(s.partsBuf) < n {
		s.partsBuf = make([][]byte, n)
	}
	return s.partsBuf[:n]
}

// lazyCtx is the context of a collective checked in the segment:
// opContext(user), built on first use.
type lazyCtx struct {
	pg      *ProcessGroup
	user    context.Context
	once    sync.Once
	ctx     context.Context
	release func()
}

func (l *lazyCtx) get() context.Context {
	l.once.Do(func() { l.ctx, _, l.release = l.pg.opContext(l.user) })
	return l.ctx
}

func (l *lazyCtx) Deadline() (time.Time, bool) { return l.get().Deadline() }
func (l *lazyCtx) Done() <-chan struct{}       { return l.get().Done() }
func (l *lazyCtx) Err() error                  { return l.get().Err() }
func (l *lazyCtx) Value(key any) any           { return l.get().Value(key) }

// close releases the context, if it was built.
func (l *lazyCtx) close() {
	l.once.Do(func() {})
	if l.release != nil {
		l.release()
	}
}

// framesAgree reports whether every rank's frame of buffer i equals mine.
func (s *stage) framesAgree(c *opCtx, i int, mine []byte) bool {
	for p := range c.size() {
		if p != c.rank() && string(s.finger(p, i)) != string(mine) {
			return false
		}
	}
	return true
}

// frameWatch receives, beside a barrier of a collective checked in the
// segment that has waited for fingerprintGrace, the frames that peers send
// through the transport.
type frameWatch struct {
	ctx   lazyCtx // the collective's
	c     *opCtx
	st    *stage
	since time.Time // the first sleep of the wait
	// Set once the receives started:
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	frames  []byte  // a frame a rank, in rank order
	errs    []error // each peer's receive's outcome
	arrived atomic.Int32
	lost    atomic.Pointer[peerLink] // the first receive that failed
}

// peerLink is a peer whose link failed, and how.
type peerLink struct {
	rank int
	err  error
}

// poll is the barrier's watch: it starts the receives once the wait has
// lasted fingerprintGrace, and stops the wait once a frame arrived.
func (w *frameWatch) poll() error {
	switch lost := w.lost.Load(); {
	case w.arrived.Load() > 0:
		return errPeerFingerprint
	case lost != nil:
		return fmt.Errorf("waiting at staging barrier 1 for rank %d's data: %w", lost.rank, lost.err)
	case w.cancel != nil:
	case w.since.IsZero():
		w.since = time.Now()
	case time.Since(w.since) >= fingerprintGrace:
		w.start()
	}
	return nil
}

// start receives every peer's frame, each in a goroutine of its own, until
// stop.
func (w *frameWatch) start() {
	n, me := w.c.size(), w.c.rank()
	ctx, cancel := context.WithCancel(&w.ctx)
	w.cancel = cancel
	w.frames = make([]byte, n*fingerprintSize)
	w.errs = make([]error, n)
	for p := range n {
		if p == me {
			continue
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			err := w.c.recv(ctx, p, stepFinger, w.frames[p*fingerprintSize:(p+1)*fingerprintSize])
			w.errs[p] = err
			switch {
			case err == nil:
				w.arrived.Add(1)
				w.st.ring()
			case ctx.Err() == nil:
				// The link to p failed (p aborted, or left): the
				// barrier will not pass.
				w.lost.CompareAndSwap(nil, &peerLink{p, err})
				w.st.ring()
			}
		}()
	}
}

// collect waits for the receives that started and returns the frames they
// took, have[p] set for each (all false when none started).
func (w *frameWatch) collect(n int) (frames []byte, have []bool) {
	have = make([]bool, n)
	if w.cancel == nil {
		return make([]byte, n*fingerprintSize), have
	}
	w.wg.Wait()
	for p, err := range w.errs {
		have[p] = p != w.c.rank() && err == nil
	}
	return w.frames, have
}

// stop ends the receives, if any started, and releases the context.
func (w *frameWatch) stop() {
	if w.cancel != nil {
		w.cancel()
		w.wg.Wait()
	}
	w.ctx.close()
}
