//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/futex"
	"github.com/tandemml/tandem/internal/liveness"
)

const (
	// frameMagic marks every frame header, so that a ring written by
	// anything but a Tandem sender fails loudly instead of being misread.
	frameMagic = 0x6672_616d_6531_7464
	// tick bounds one futex sleep: how often a blocked wait looks at the
	// context, the peer's state and its heartbeat.
	tick = 10 * time.Millisecond
	// spinFor is how long a wait polls before it sleeps in the kernel. A
	// futex sleep and wake-up costs tens of microseconds on a virtual
	// machine (a 4 KiB ping-pong between processes took 55 to 80 µs
	// sleeping after 200 polls, 6.6 µs polling 50 µs), and the poll yields
	// the processor between looks, so it takes no time from the rank's
	// other goroutines (DDP's backward pass ran as fast polling as
	// sleeping: tandem bench ddp, world 2, one core a rank).
	spinFor = 50 * time.Microsecond
	// holdMin and holdFor: a frame of holdMin bytes or more that arrives
	// before its receive waits up to holdFor in the ring for it (see claim).
	holdMin = 64 << 10
	// beatEvery is how often a rank stores the time in its heartbeat word:
	// often enough for any peer's timeout, whatever interval this rank's own
	// configuration would pick (a store to memory costs next to nothing).
	beatEvery = 100 * time.Millisecond
	// maxPiece is the most a sender copies into the ring before publishing
	// it, so that the receiver copies one piece out while the next goes in.
	maxPiece = 128 << 10
)

// holdFor is how long a held frame waits for its receive (a variable so
// that a test can make the wait long enough to tell from scheduling).
var holdFor = 5 * time.Millisecond

// Transport is a shared-memory transport.Transport: one ring per ordered
// pair of ranks in a segment that every rank of the world maps. Create it
// with Backend.Connect or Backend.ConnectSHM.
type Transport struct {
	rank, size int
	maxMsg     int64
	live       liveness.Config
	seg        *segment
	pid        int
	spin       time.Duration // how long a wait polls before it sleeps (see spinFor)

	// own is this rank's anchor for the race detector: every send releases
	// it, every receive acquires it (see race_on.go).
	own *uint64

	down  atomic.Pointer[error] // set once by Abort or Close
	dead  chan struct{}         // closed when down is set
	inbox []*inbox              // per source rank; inbox[rank] holds messages to itself
	out   []*outbox             // per destination rank

	// users is held shared by every caller that touches the mapping, and
	// exclusively by Close while it unmaps.
	users   sync.RWMutex
	readers sync.WaitGroup // the reader goroutines and the heartbeat
	stop    chan struct{}  // closed by Close: the heartbeat ends

	life      sync.Mutex // serialises Abort and Close
	closeOnce sync.Once
}

var _ transport.Transport = (*Transport)(nil)

// inbox holds, for one source rank, the receives posted before their
// message and the messages that arrived before their receive.
type inbox struct {
	t   *Transport
	src int

	mu      sync.Mutex
	waiters map[transport.Tag][]*waiter
	msgs    map[transport.Tag][][]byte
	lost    error // why no more messages come from src

	// gone holds lost once it wraps ErrPeerLost: sends to src fail with it.
	gone atomic.Pointer[error]

	// The reader, holding a large frame under tag want that no receive
	// claims yet, sets wanting and waits on posted, which Recv pokes when
	// it posts a receive.
	wanting bool
	want    transport.Tag
	posted  chan struct{} // buffered 1
}

type waiter struct {
	buf    []byte
	reduce func(dst, src []byte) // nil: copy the message into buf
	done   chan error            // buffered 1

	mu        sync.Mutex // held by the reader while it writes buf
	abandoned bool       // the receive gave up: buf must not be written
}

// outbox is the sending end of one ring; mu makes its sender single.
type outbox struct {
	mu   sync.Mutex
	ch   int    // channel offset
	head uint64 // bytes published so far
	err  error  // set when a send abandoned a message mid-way
}

func newTransport(rank, size int, maxMsg int64, live liveness.Config, seg *segment, spin time.Duration) *Transport {
	t := &Transport{own: new(uint64), rank: rank, size: size, maxMsg: maxMsg, live: live, seg: seg, pid: os.Getpid(), spin: spin,
		inbox: make([]*inbox, size), out: make([]*outbox, size), stop: make(chan struct{}), dead: make(chan struct{})}
	for r := range size {
		t.inbox[r] = &inbox{t: t, src: r, waiters: map[transport.Tag][]*waiter{}, msgs: map[transport.Tag][][]byte{},
			posted: make(chan struct{}, 1)}
		if r != rank {
			t.out[r] = &outbox{ch: seg.channel(rank, r)}
		}
	}
	return t
}

// attach marks this rank present in the segment.
func (t *Transport) attach() {
	b := t.seg.rank(t.rank)
	t.seg.u64(b + rkPid).Store(uint64(t.pid))
	t.seg.u64(b + rkHeartbeat).Store(uint64(time.Now().UnixNano()))
	t.seg.u64(b + rkState).Store(stateAttached)
}

// start runs one reader per peer and the heartbeat.
func (t *Transport) start() {
	for r := range t.size {
		if r != t.rank {
			t.readers.Add(1)
			go t.inbox[r].read()
		}
	}
	t.readers.Add(1)
	go t.heartbeat()
}

func (t *Transport) heartbeat() {
	defer t.readers.Done()
	hb := t.seg.u64(t.seg.rank(t.rank) + rkHeartbeat)
	tk := time.NewTicker(beatEvery)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tk.C:
			hb.Store(uint64(now.UnixNano()))
		}
	}
}

// Rank returns this process's rank.
func (t *Transport) Rank() int { return t.rank }

// Size returns the number of ranks in the world.
func (t *Transport) Size() int { return t.size }

// MaxMessage returns the largest message this transport sends or receives.
func (t *Transport) MaxMessage() int64 { return t.maxMsg }

// PeerTimeout returns how long a peer's heartbeat may stay still before it
// counts as unresponsive, or a negative duration when the check is off.
func (t *Transport) PeerTimeout() time.Duration { return t.live.Timeout }

// PeerError returns why messages from rank stopped (an error wrapping
// ErrPeerLost, ErrClosed or the cause of an Abort), or nil while it stands.
func (t *Transport) PeerError(rank int) error {
	if rank < 0 || rank >= t.size {
		return nil
	}
	in := t.inbox[rank]
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.lost
}

func (t *Transport) downErr() error {
	if e := t.down.Load(); e != nil {
		return *e
	}
	return nil
}

func (t *Transport) check(ctx context.Context, op string, peer int, buf []byte) error {
	if err := errs.CheckContext(ctx, "shm", op); err != nil {
		return err
	}
	if peer < 0 || peer >= t.size {
		return fmt.Errorf("shm: %s: peer rank %d out of range for world size %d: %w", op, peer, t.size, transport.ErrInvalidArgument)
	}
	if int64(len(buf)) > t.maxMsg {
		return fmt.Errorf("shm: rank %d: %s %d bytes, rank %d: above the message limit of %d bytes (transport.Config.MaxMessage): %w",
			t.rank, op, len(buf), peer, t.maxMsg, transport.ErrTooLarge)
	}
	return t.downErr()
}

// ctxErr is the error of a send or receive (op "send" or "recv") with peer
// that gave up because ctx ended, under the context rule of internal/errs.
func (t *Transport) ctxErr(ctx context.Context, op string, peer int, tag transport.Tag) error {
	dir := "to"
	if op == "recv" {
		dir = "from"
	}
	return errs.FromContext(ctx, fmt.Sprintf("shm: %s: rank %d %s rank %d (tag %#x)", op, t.rank, dir, peer, uint64(tag)))
}

// peerGone returns an error wrapping ErrPeerLost when rank p has closed,
// aborted, exited or stopped beating; nil while it looks alive. The
// process and heartbeat checks are skipped when quick.
func (t *Transport) peerGone(p int, quick bool) error {
	b := t.seg.rank(p)
	switch t.seg.u64(b + rkState).Load() {
	case stateAborted:
		n := min(int(t.seg.u64(b+rkCauseLen).Load()), maxCause)
		return fmt.Errorf("shm: rank %d aborted: %s: %w", p, t.seg.mem[b+rkCause:b+rkCause+n], transport.ErrPeerAborted)
	case stateClosed:
		return fmt.Errorf("shm: rank %d closed its transport: %w", p, transport.ErrPeerLost)
	}
	if quick {
		return nil
	}
	if pid := int(t.seg.u64(b + rkPid).Load()); pid != t.pid && processGone(pid) {
		return fmt.Errorf("shm: rank %d (process %d) exited without closing its transport: %w", p, pid, transport.ErrPeerLost)
	}
	if t.live.Timeout > 0 {
		last := time.Unix(0, int64(t.seg.u64(b+rkHeartbeat).Load()))
		if time.Since(last) > t.live.Timeout {
			return fmt.Errorf("shm: rank %d: %s: %w", p, liveness.Unresponsive(last), transport.ErrPeerLost)
		}
	}
	return nil
}

// await returns once cond holds, polling briefly and then sleeping on the
// futex word seq (announced through flag, so that the other side only
// makes the wake-up system call when someone sleeps). Before each sleep it
// runs check and gives up with its error, unless cond became true
// meanwhile; check is told to skip its costlier tests (system calls)
// before the first sleep, which most waits never get past.
func await(spin time.Duration, cond func() bool, seq, flag *atomic.Uint32, check func(full bool) error) error {
	if cond() {
		return nil
	}
	if futex.Poll(spin, cond) {
		return nil
	}
	for full := false; ; full = true {
		s := seq.Load()
		flag.Store(1)
		if cond() {
			flag.Store(0)
			return nil
		}
		if err := check(full); err != nil {
			flag.Store(0)
			if cond() {
				return nil
			}
			return err
		}
		futex.Wait(seq, s, tick)
		flag.Store(0)
	}
}

// Spin reports how long this transport's waits poll before they sleep (see
// WithSpin).
func (t *Transport) Spin() time.Duration { return t.spin }

// OneHost reports true: a shared-memory world runs on one host
// (transport.OneHost).
func (t *Transport) OneHost() bool { return true }

// signal bumps seq and wakes its sleeper, if any. The sequentially
// consistent atomics order this against await: either the sleeper's flag is
// seen here, or the sleeper's re-check of its condition sees what was
// published before signal.
func signal(seq, flag *atomic.Uint32) {
	seq.Add(1)
	if flag.Load() != 0 {
		futex.Wake(seq)
	}
}

// Send delivers buf to peer under tag: it copies buf into the ring to peer,
// in pieces published one by one so that the receiver copies each out while
// the next goes in, and returns when the last piece is in the ring.
func (t *Transport) Send(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	if err := t.check(ctx, "sending", peer, buf); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return t.ctxErr(ctx, "send", peer, tag)
	}
	if peer == t.rank {
		return t.inbox[peer].deliver(tag, buf)
	}
	t.users.RLock()
	defer t.users.RUnlock()
	if err := t.downErr(); err != nil {
		return err
	}
	if err := t.inbox[peer].gone.Load(); err != nil {
		return fmt.Errorf("shm: rank %d: sending to rank %d: %w", t.rank, peer, *err)
	}
	if err := t.peerGone(peer, true); err != nil {
		return fmt.Errorf("shm: rank %d: sending to rank %d: %w", t.rank, peer, err)
	}
	o := t.out[peer]
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return o.err
	}
	return t.put(ctx, o, peer, tag, buf)
}

func (t *Transport) put(ctx context.Context, o *outbox, peer int, tag transport.Tag, buf []byte) error {
	s := t.seg
	ring := s.ring(o.ch)
	capa := uint64(len(ring))
	headW, tailW := s.u64(o.ch+chHead), s.u64(o.ch+chTail)
	dataSeq, dataWait := s.u32(o.ch+chDataSeq), s.u32(o.ch+chDataWait)
	spaceSeq, spaceWait := s.u32(o.ch+chSpaceSeq), s.u32(o.ch+chSpaceWait)
	piece := min(capa/4, maxPiece)
	anchor := s.anchor(o.ch)
	head := o.head
	padded := uint64(roundUp(len(buf), frameHeader))
	published := false
	check := func(full bool) error {
		if err := t.downErr(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return t.ctxErr(ctx, "send", peer, tag)
		}
		if err := t.peerGone(peer, !full); err != nil {
			return fmt.Errorf("shm: rank %d: sending to rank %d: %w", t.rank, peer, err)
		}
		return nil
	}
	var off uint64 // payload bytes (with padding) written
	for first := true; first || off < padded; first = false {
		want := min(padded-off, piece)
		if first {
			want += frameHeader
		}
		if capa-(head-tailW.Load()) < want {
			err := await(t.spin, func() bool { return capa-(head-tailW.Load()) >= want }, spaceSeq, spaceWait, check)
			if err != nil {
				if published {
					// The receiver holds part of this message: the ring
					// cannot carry another one.
					o.err = fmt.Errorf("shm: rank %d: an earlier send to rank %d stopped half-way: %w: %w", t.rank, peer, err, transport.ErrPeerLost)
					s.u32(o.ch + chBroken).Store(1)
					signal(dataSeq, dataWait)
				}
				return err
			}
		}
		raceAcquire(anchor)
		if first {
			h := ring[head%capa : head%capa+frameHeader]
			binary.LittleEndian.PutUint64(h[0:], uint64(tag))
			binary.LittleEndian.PutUint64(h[8:], uint64(len(buf)))
			binary.LittleEndian.PutUint64(h[16:], frameMagic)
			head += frameHeader
			want -= frameHeader
		}
		if lo, hi := min(off, uint64(len(buf))), min(off+want, uint64(len(buf))); hi > lo {
			copyIn(ring, head, buf[lo:hi])
		}
		head += want
		off += want
		raceRelease(anchor)
		raceRelease(unsafe.Pointer(t.own))
		headW.Store(head)
		published = true
		signal(dataSeq, dataWait)
	}
	o.head = head
	return nil
}

// copyIn copies data into ring starting at stream position pos, wrapping.
func copyIn(ring []byte, pos uint64, data []byte) {
	p := pos % uint64(len(ring))
	if n := copy(ring[p:], data); n < len(data) {
		copy(ring, data[n:])
	}
}

// copyOut fills dst from ring starting at stream position pos, wrapping.
func copyOut(dst, ring []byte, pos uint64) {
	p := pos % uint64(len(ring))
	if n := copy(dst, ring[p:]); n < len(dst) {
		copy(dst[n:], ring)
	}
}

// reduceOut combines dst with the ring's bytes from stream position pos,
// in two calls where they wrap.
func reduceOut(reduce func(dst, src []byte), dst, ring []byte, pos uint64) {
	p := int(pos % uint64(len(ring)))
	first := min(len(dst), len(ring)-p)
	reduce(dst[:first], ring[p:p+first])
	if first < len(dst) {
		reduce(dst[first:], ring[:len(dst)-first])
	}
}

// Recv receives the next message from peer under tag into buf, which must
// have exactly the message's length. A receive posted before its message
// arrives gets the message copied straight from the ring into buf.
func (t *Transport) Recv(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	return t.recv(ctx, peer, tag, buf, nil)
}

// RecvReduce receives the next message from peer under tag, which must be
// exactly len(dst) bytes long, and combines it into dst by calling
// reduce(dst[lo:hi], src) for consecutive pieces, src holding the
// message's bytes lo:hi and valid only during the call. Pieces start at
// multiples of 64 bytes of the message, so they never split an element.
// When the receive is posted before the message arrives (the usual case in
// a ring all-reduce), the pieces are read straight out of the ring, so the
// message is never copied; comm's ring all-reduce uses it when the
// transport has it. When it fails, dst may be partly reduced.
func (t *Transport) RecvReduce(ctx context.Context, peer int, tag transport.Tag, dst []byte, reduce func(dst, src []byte)) error {
	if reduce == nil {
		return fmt.Errorf("shm: rank %d: RecvReduce from rank %d without a reduce function: %w", t.rank, peer, transport.ErrInvalidArgument)
	}
	return t.recv(ctx, peer, tag, dst, reduce)
}

func (t *Transport) recv(ctx context.Context, peer int, tag transport.Tag, buf []byte, reduce func(dst, src []byte)) error {
	if err := t.check(ctx, "receiving", peer, buf); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return t.ctxErr(ctx, "recv", peer, tag)
	}
	in := t.inbox[peer]
	in.mu.Lock()
	if q := in.msgs[tag]; len(q) > 0 {
		msg := q[0]
		q[0] = nil
		if len(q) == 1 {
			delete(in.msgs, tag)
		} else {
			in.msgs[tag] = q[1:]
		}
		in.mu.Unlock()
		return t.fill(buf, reduce, msg, peer, tag)
	}
	if in.lost != nil {
		err := in.lost
		in.mu.Unlock()
		return err
	}
	w := &waiter{buf: buf, reduce: reduce, done: make(chan error, 1)}
	in.waiters[tag] = append(in.waiters[tag], w)
	if in.wanting {
		in.wanting = false
		select {
		case in.posted <- struct{}{}:
		default:
		}
	}
	in.mu.Unlock()

	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
	}
	// Withdraw the receive unless the reader has taken it; then stop the
	// reader from writing buf any further, unless it has finished.
	in.mu.Lock()
	q := in.waiters[tag]
	for i, x := range q {
		if x == w {
			q = append(q[:i], q[i+1:]...)
			if len(q) == 0 {
				delete(in.waiters, tag)
			} else {
				in.waiters[tag] = q
			}
			in.mu.Unlock()
			return t.ctxErr(ctx, "recv", peer, tag)
		}
	}
	in.mu.Unlock()
	w.mu.Lock()
	w.abandoned = true
	w.mu.Unlock()
	select {
	case err := <-w.done:
		return err
	default:
		return t.ctxErr(ctx, "recv", peer, tag)
	}
}

// fill puts a whole message into a receive's buffer: copied, or combined
// by reduce when it is not nil.
func (t *Transport) fill(dst []byte, reduce func(dst, src []byte), msg []byte, peer int, tag transport.Tag) error {
	if len(dst) != len(msg) {
		return mismatch(t.rank, peer, tag, len(msg), len(dst))
	}
	if reduce != nil {
		reduce(dst, msg)
	} else {
		copy(dst, msg)
	}
	return nil
}

func mismatch(rank, peer int, tag transport.Tag, got, want int) error {
	return fmt.Errorf("shm: rank %d received %d bytes from rank %d under tag %#x but its receive buffer holds %d bytes: %w",
		rank, got, peer, uint64(tag), want, transport.ErrMismatch)
}

// deliver hands a message to this rank's own inbox (a send to itself).
func (in *inbox) deliver(tag transport.Tag, buf []byte) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.lost != nil {
		return in.lost
	}
	if w := in.take(tag); w != nil {
		w.done <- in.t.fill(w.buf, w.reduce, buf, in.src, tag)
		return nil
	}
	in.msgs[tag] = append(in.msgs[tag], append([]byte(nil), buf...))
	return nil
}

// take pops the oldest receive waiting under tag; in.mu is held.
func (in *inbox) take(tag transport.Tag) *waiter {
	q := in.waiters[tag]
	if len(q) == 0 {
		return nil
	}
	w := q[0]
	q[0] = nil
	if len(q) == 1 {
		delete(in.waiters, tag)
	} else {
		in.waiters[tag] = q[1:]
	}
	return w
}

// fail records why no more messages come from the source and fails the
// receives waiting for one.
func (in *inbox) fail(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.lost == nil {
		in.lost = err
		if errors.Is(err, transport.ErrPeerLost) {
			in.gone.Store(&err)
		}
	}
	for tag, q := range in.waiters {
		for _, w := range q {
			w.done <- in.lost
		}
		delete(in.waiters, tag)
	}
}

// read is the reader of the ring from in.src: it takes frames off the ring
// in order and copies each into the receive waiting for it, or into a new
// buffer that a later receive takes.
func (in *inbox) read() {
	t := in.t
	defer t.readers.Done()
	s := t.seg
	ch := s.channel(in.src, t.rank)
	ring := s.ring(ch)
	capa := uint64(len(ring))
	headW, tailW := s.u64(ch+chHead), s.u64(ch+chTail)
	dataSeq, dataWait := s.u32(ch+chDataSeq), s.u32(ch+chDataWait)
	spaceSeq, spaceWait := s.u32(ch+chSpaceSeq), s.u32(ch+chSpaceWait)
	tail := tailW.Load()
	anchor := s.anchor(ch)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	check := func(full bool) error {
		if err := t.downErr(); err != nil {
			return err
		}
		if s.u32(ch+chBroken).Load() != 0 {
			return fmt.Errorf("shm: rank %d: rank %d gave up on a message half-way (its send failed); no more messages can follow on this link: %w",
				t.rank, in.src, transport.ErrPeerLost)
		}
		if err := t.peerGone(in.src, !full); err != nil {
			return fmt.Errorf("shm: rank %d: receiving from rank %d: %w", t.rank, in.src, err)
		}
		return nil
	}
	for {
		if headW.Load()-tail < frameHeader {
			if err := await(t.spin, func() bool { return headW.Load()-tail >= frameHeader }, dataSeq, dataWait, check); err != nil {
				in.fail(err)
				return
			}
		}
		raceAcquire(anchor)
		h := ring[tail%capa : tail%capa+frameHeader]
		tag := transport.Tag(binary.LittleEndian.Uint64(h[0:]))
		size := binary.LittleEndian.Uint64(h[8:])
		if binary.LittleEndian.Uint64(h[16:]) != frameMagic || size > uint64(t.maxMsg) {
			in.fail(fmt.Errorf("shm: rank %d: the ring from rank %d holds a malformed frame (length %d, limit %d); both ranks must run the same Tandem with the same MaxMessage: %w",
				t.rank, in.src, size, t.maxMsg, transport.ErrPeerLost))
			return
		}
		tail += frameHeader
		w, err := in.claim(tag, size, timer)
		if err != nil {
			in.fail(err)
			return
		}
		var dst []byte
		var result error
		switch {
		case w == nil:
			dst = make([]byte, size)
		case uint64(len(w.buf)) != size:
			result = mismatch(t.rank, in.src, tag, int(size), len(w.buf))
		default:
			dst = w.buf
		}
		padded := uint64(roundUp(int(size), frameHeader))
		for got := uint64(0); got < padded || got == 0; {
			if got == padded { // an empty message
				break
			}
			if headW.Load() == tail {
				if err := await(t.spin, func() bool { return headW.Load() != tail }, dataSeq, dataWait, check); err != nil {
					if w != nil {
						w.done <- err
					}
					in.fail(err)
					return
				}
			}
			n := min(headW.Load()-tail, padded-got)
			raceAcquire(anchor)
			raceAcquire(unsafe.Pointer(t.own))
			if lo, hi := got, min(got+n, size); hi > lo && dst != nil {
				if w != nil {
					w.mu.Lock()
					switch {
					case w.abandoned:
					case w.reduce != nil:
						reduceOut(w.reduce, dst[lo:hi], ring, tail)
					default:
						copyOut(dst[lo:hi], ring, tail)
					}
					w.mu.Unlock()
				} else {
					copyOut(dst[lo:hi], ring, tail)
				}
			}
			tail += n
			got += n
			raceRelease(anchor)
			tailW.Store(tail)
			signal(spaceSeq, spaceWait)
		}
		if size == 0 {
			tailW.Store(tail)
			signal(spaceSeq, spaceWait)
		}
		if w != nil {
			w.done <- result
			continue
		}
		in.mu.Lock()
		if w := in.take(tag); w != nil {
			w.done <- t.fill(w.buf, w.reduce, dst, in.src, tag)
		} else {
			in.msgs[tag] = append(in.msgs[tag], dst)
		}
		in.mu.Unlock()
	}
}

// claim returns the receive waiting for a frame under tag of size bytes,
// or nil when the frame is to be buffered. A large frame that no receive
// claims yet is held in the ring for up to holdFor, so that a receive
// posted meanwhile gets it copied straight into its buffer rather than
// through a second one. Small frames are buffered at once, and so is a
// large one as soon as a receive under another tag is waiting (its frame
// may be behind this one) or the time is up.
func (in *inbox) claim(tag transport.Tag, size uint64, timer *time.Timer) (*waiter, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	w := in.take(tag)
	if w != nil || size < holdMin {
		return w, nil
	}
	deadline := time.Now().Add(holdFor)
	for {
		left := time.Until(deadline)
		if left <= 0 || len(in.waiters) > 0 {
			// Time is up, or a receive under another tag waits, perhaps
			// for a frame behind this one: buffer it.
			return nil, nil
		}
		in.want, in.wanting = tag, true
		in.mu.Unlock()
		timer.Reset(left)
		select {
		case <-in.posted:
		case <-timer.C:
		case <-in.t.dead:
		}
		in.mu.Lock()
		in.wanting = false
		if err := in.t.downErr(); err != nil {
			return nil, err
		}
		if w := in.take(tag); w != nil {
			return w, nil
		}
	}
}

// Abort fails every pending and future operation with an error wrapping
// cause and marks this rank aborted in the segment, waking every peer that
// waits on it: their operations with this rank fail with ErrPeerLost.
// Close must still be called.
func (t *Transport) Abort(cause error) {
	if cause == nil {
		cause = errors.New("no cause given")
	}
	err := fmt.Errorf("shm: rank %d aborted: %w", t.rank, cause)
	t.life.Lock()
	defer t.life.Unlock()
	if !t.down.CompareAndSwap(nil, &err) {
		return
	}
	close(t.dead)
	if t.size > 1 {
		b := t.seg.rank(t.rank)
		text := cause.Error()
		n := copy(t.seg.mem[b+rkCause:b+rkCause+maxCause], text)
		t.seg.u64(b + rkCauseLen).Store(uint64(n))
		t.seg.u64(b + rkState).Store(stateAborted)
		t.wakeAll()
	}
	for _, in := range t.inbox {
		in.fail(err)
	}
}

// wakeAll wakes every sleeper on this rank's rings, here and in the peers.
func (t *Transport) wakeAll() {
	for p := range t.size {
		if p == t.rank {
			continue
		}
		for _, ch := range []int{t.seg.channel(t.rank, p), t.seg.channel(p, t.rank)} {
			for _, w := range []int{chDataSeq, chSpaceSeq} {
				seq := t.seg.u32(ch + w)
				seq.Add(1)
				futex.Wake(seq)
			}
		}
	}
}

// Close marks this rank closed in the segment (peers receive what it sent
// and then see it lost), fails pending operations with ErrClosed, stops the
// readers and unmaps the segment. Close is idempotent.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		err := fmt.Errorf("shm: rank %d: transport closed: %w", t.rank, transport.ErrClosed)
		t.life.Lock()
		if t.down.CompareAndSwap(nil, &err) {
			close(t.dead)
			if t.size > 1 {
				t.seg.u64(t.seg.rank(t.rank) + rkState).Store(stateClosed)
			}
		}
		if t.size > 1 {
			t.wakeAll()
		}
		for _, in := range t.inbox {
			in.fail(t.downErr())
		}
		t.life.Unlock()
		close(t.stop)
		t.readers.Wait()
		t.users.Lock()
		if t.seg.mem != nil {
			t.seg.unmap()
			t.seg.mem = nil
		}
		t.users.Unlock()
	})
	return nil
}
