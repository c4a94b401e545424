package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// A fingerprint frame is a fixed-size message that every member of a group
// sends to every other member for each collective:
//
//	[0:4]   sequence number (uint32, little endian)
//	[4]     1 when this rank's own arguments are invalid
//	[5:7]   length of the text (uint16)
//	[7:]    text: the collective's description, e.g. all_reduce(float32,[4],sum)
//
// A description too long for the frame is cut and ends in a hash of the whole,
// so that frames compare equal exactly when descriptions do.
const (
	fingerprintSize = 256
	fingerprintText = fingerprintSize - 7
)

func encodeFingerprint(seq uint32, op collective) []byte {
	f := make([]byte, fingerprintSize)
	encodeFingerprintInto(f, seq, op)
	return f
}

// encodeFingerprintInto writes the frame of collective op, number seq, into
// f, fingerprintSize bytes.
func encodeFingerprintInto(f []byte, seq uint32, op collective) {
	binary.LittleEndian.PutUint32(f[0:4], seq)
	f[4] = 0
	text := op.desc
	if op.invalid != nil {
		f[4] = 1
		text = op.desc + " with invalid arguments (" + op.invalid.Error() + ")"
	}
	if len(text) > fingerprintText {
		h := fnv.New64a()
		h.Write([]byte(text))
		suffix := fmt.Sprintf("...#%016x", h.Sum64())
		text = text[:fingerprintText-len(suffix)] + suffix
	}
	binary.LittleEndian.PutUint16(f[5:7], uint16(len(text)))
	clear(f[7:])
	copy(f[7:], text)
}

func fingerprintDesc(f []byte) string {
	n := int(binary.LittleEndian.Uint16(f[5:7]))
	if n > fingerprintText {
		n = fingerprintText
	}
	return string(f[7 : 7+n])
}

// fingerprintGrace is how long a collective's algorithm runs before its
// fingerprint check starts beside it (see execute). Short collectives check
// afterwards, without a goroutine of their own.
const fingerprintGrace = 20 * time.Millisecond

// fingerprintDrain is how long a collective whose time is up still waits
// for fingerprints that are on their way, to tell which rank never joined.
const fingerprintDrain = 50 * time.Millisecond

// sendFingerprints sends this rank's frame to every other member.
func (pg *ProcessGroup) sendFingerprints(ctx context.Context, c *opCtx, op collective, mine []byte) error {
	n, me := c.size(), c.rank()
	for i := 1; i < n; i++ {
		peer := (me + i) % n
		if err := c.send(ctx, peer, stepFinger, mine); err != nil {
			return fmt.Errorf("%s #%d: sending fingerprint: %w", op.desc, c.seq, err)
		}
	}
	return nil
}

// recvFingerprints receives every other member's frame and compares them
// with this rank's. It returns nil when all agree, an error wrapping
// ErrMismatch (the same text on every rank, naming both sides) when they do
// not, or the transport's error. When ctx has already ended, frames that
// arrived (or arrive within fingerprintDrain) are still taken, so that the
// error can name the rank that never joined.
func (pg *ProcessGroup) recvFingerprints(ctx context.Context, c *opCtx, op collective, mine []byte) error {
	return pg.recvFingerprintsHaving(ctx, c, op, mine, make([]byte, c.size()*fingerprintSize), nil)
}

// recvFingerprintsHaving is recvFingerprints into frames (a frame a rank,
// in rank order), where the frames of the peers p with have[p] already
// arrived (have may be nil: none did).
func (pg *ProcessGroup) recvFingerprintsHaving(ctx context.Context, c *opCtx, op collective, mine, frames []byte, have []bool) error {
	n, me := c.size(), c.rank()
	rctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), fingerprintDrain)
		defer cancel()
	}
	copy(frames[me*fingerprintSize:], mine)
	for peer := 0; peer < n; peer++ {
		if peer == me || have != nil && have[peer] {
			continue
		}
		f := frames[peer*fingerprintSize : (peer+1)*fingerprintSize]
		if err := c.recv(rctx, peer, stepFinger, f); err != nil {
			// A mismatch already seen explains the failure better (the
			// rank that saw it may have left).
			for q := 0; q < n; q++ {
				if q == me || q >= peer && (have == nil || !have[q]) {
					continue // not received
				}
				if g := frames[q*fingerprintSize : (q+1)*fingerprintSize]; string(g) != string(mine) {
					return fmt.Errorf("comm: collective #%d on group %q: rank %d called %s but rank %d called %s (rank %d could not hear from rank %d: %v): %w",
						c.seq, pg.name, me, fingerprintDesc(mine), q, fingerprintDesc(g), me, peer, err, ErrMismatch)
				}
			}
			if ctx.Err() != nil && !errors.Is(err, ErrPeerLost) {
				// A peer that the transport found unresponsive (or lost)
				// did not skip the collective: say what happened to it.
				if lost := pg.world.peerLost(pg.members[peer]); lost != nil {
					return fmt.Errorf("%s #%d: waiting for rank %d's fingerprint: %w", op.desc, c.seq, peer, lost)
				}
				return errs.FromContext(ctx, fmt.Sprintf("%s #%d on group %q: rank %d never joined this collective (is it stuck, or did it call a different number of collectives?)",
					op.desc, c.seq, pg.name, peer))
			}
			return fmt.Errorf("%s #%d: waiting for rank %d's fingerprint: %w", op.desc, c.seq, peer, err)
		}
	}
	ref := frames[:fingerprintSize]
	for peer := 1; peer < n; peer++ {
		f := frames[peer*fingerprintSize : (peer+1)*fingerprintSize]
		if string(f) == string(ref) {
			continue
		}
		var odd []string
		for q := 1; q < n; q++ {
			if string(frames[q*fingerprintSize:(q+1)*fingerprintSize]) != string(ref) {
				odd = append(odd, fmt.Sprint(q))
			}
		}
		return fmt.Errorf("comm: collective #%d on group %q: rank 0 called %s but rank %d called %s (ranks differing from rank 0: %s; this is rank %d): %w",
			c.seq, pg.name, fingerprintDesc(ref), peer, fingerprintDesc(f), strings.Join(odd, ","), me, ErrMismatch)
	}
	return nil
}

// fingerprintCheck receives a collective's fingerprints exactly once: beside
// the algorithm, from a timer's goroutine once fingerprintGrace has passed,
// or after it, from the collective's own goroutine, whichever claims it
// first.
type fingerprintCheck struct {
	pg      *ProcessGroup
	ctx     context.Context
	c       *opCtx
	op      collective
	mine    []byte
	claimed atomic.Bool
	timer   *time.Timer
	done    chan struct{} // closed when the timer's check has finished
	err     error         // the timer's check's result, read after done
}

// watchFingerprints arms the check beside the algorithm: should the
// algorithm still run after fingerprintGrace, the fingerprints are received
// concurrently, and a failed check stops the algorithm (stop with
// errStoppedByFingerprint).
func (pg *ProcessGroup) watchFingerprints(ctx context.Context, stop context.CancelCauseFunc, c *opCtx, op collective, mine []byte) *fingerprintCheck {
	f := &fingerprintCheck{pg: pg, ctx: ctx, c: c, op: op, mine: mine, done: make(chan struct{})}
	f.timer = time.AfterFunc(fingerprintGrace, func() {
		if !f.claimed.CompareAndSwap(false, true) {
			return
		}
		f.err = pg.recvFingerprints(ctx, c, op, mine)
		if f.err != nil {
			stop(errStoppedByFingerprint)
		}
		close(f.done)
	})
	return f
}

// result returns the check's outcome, receiving the fingerprints here
// unless the timer's goroutine already does.
func (f *fingerprintCheck) result() error {
	f.timer.Stop()
	if f.claimed.CompareAndSwap(false, true) {
		return f.pg.recvFingerprints(f.ctx, f.c, f.op, f.mine)
	}
	<-f.done
	return f.err
}

// abandon gives up the check (the group was aborted): it waits for a check
// that already started, which the abort ends promptly, and returns what that
// check found (nil when none had started).
func (f *fingerprintCheck) abandon() error {
	f.timer.Stop()
	if !f.claimed.CompareAndSwap(false, true) {
		<-f.done
		return f.err
	}
	return nil
}

// quick receives the fingerprints here, waiting at most d for them, when the
// timer's goroutine has not claimed the check; mine reports whether it did
// (if not, the caller learns the outcome from abandon). It serves the path
// where the algorithm lost a peer: fingerprints that peer sent before it
// left are still delivered, so a mismatch is reported as one.
func (f *fingerprintCheck) quick(d time.Duration) (err error, mine bool) {
	f.timer.Stop()
	if !f.claimed.CompareAndSwap(false, true) {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), d)
	defer cancel()
	return f.pg.recvFingerprints(ctx, f.c, f.op, f.mine), true
}
