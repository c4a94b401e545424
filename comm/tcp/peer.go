package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/liveness"
)

// readBufferSize is the reader's buffer: small frames (headers, short
// messages) come out of it several per system call, while large payloads
// bypass it and land directly in the destination. It is kept small because
// whatever part of a large payload it reads ahead gets copied once more.
const readBufferSize = 16 << 10

// stealMin is the smallest message whose Recv, posted while the payload is
// streaming into a buffer, takes over the rest of the payload directly.
const stealMin = 32 << 10

// recvWait is how long the reader leaves a large payload in the socket
// waiting for its Recv before buffering it.
const recvWait = time.Millisecond

// maxDiscard is the largest oversized payload a reader skips; a longer frame
// is taken for a corrupt stream.
const maxDiscard = 1 << 40

// peer is this rank's link to one other rank (or, with conn nil, to itself).
type peer struct {
	t    *Transport
	rank int
	conn *net.TCPConn

	// Single-copy transfers (singlecopy.go), settled at connection set-up.
	refOut bool // large messages to this peer go by reference
	refPID int  // the peer's process id when its references are read from its memory; 0 when not

	// Write side; everything below wsem is guarded by holding it.
	wsem    chan struct{} // capacity 1: the write lock
	whdr    [headerSize]byte
	wref    [refBodySize]byte
	wvec    [2][]byte
	wbufs   net.Buffers
	wclosed bool
	// cutSend interrupts the write of a Send whose context ended; it is
	// prebound so that Send does not allocate it, and reports on cutDone.
	cutSend func()
	cutDone chan struct{}

	// Read side, used by the reader goroutine only (posted is signalled by
	// every Recv that posts a request).
	rd        *bufio.Reader
	rhdr      [headerSize]byte
	rref      [refBodySize]byte
	posted    chan struct{}
	waitTimer *time.Timer

	mu      sync.Mutex
	queues  map[transport.Tag]*tagQueue
	acks    map[uint64]chan error // sends by reference waiting for their acknowledgement
	nextRef uint64                // last reference id used; guarded by mu
	err     error                 // why the peer is gone; guarded by mu
	errp    atomic.Pointer[error]
	gone    chan struct{} // closed when err is set

	// Liveness (liveness.go).
	heard atomic.Int64  // Transport.clock at the last read that returned data
	sent  atomic.Bool   // a frame went out since the watcher last looked
	asked atomic.Int64  // the heartbeat interval the peer asked for; 0 until it does
	nudge chan struct{} // capacity 1: tells the watcher that asked is set
}

func newPeer(t *Transport, rank int, c *net.TCPConn, host sameHost) *peer {
	p := &peer{t: t, rank: rank, conn: c, wsem: make(chan struct{}, 1),
		queues: map[transport.Tag]*tagQueue{}, acks: map[uint64]chan error{}, gone: make(chan struct{}),
		refOut: host.offer, refPID: host.pid}
	if c != nil {
		// The kernel gives up on data the peer's machine does not
		// acknowledge within the peer timeout. Where the option is
		// missing, the heartbeats still notice a silent peer.
		_ = liveness.SetUserTimeout(c, t.live.Timeout)
		p.heard.Store(t.clock())
		p.nudge = make(chan struct{}, 1)
		p.rd = bufio.NewReaderSize(liveConn{c: c, p: p}, readBufferSize)
		p.posted = make(chan struct{}, 1)
		p.waitTimer = time.NewTimer(time.Hour)
		p.waitTimer.Stop()
		p.cutDone = make(chan struct{}, 1)
		p.cutSend = func() {
			c.SetWriteDeadline(time.Unix(1, 0))
			p.cutDone <- struct{}{}
		}
	}
	return p
}

func (p *peer) goneErr() error {
	if e := p.errp.Load(); e != nil {
		return *e
	}
	return nil
}

// fail marks the peer gone with err (first call wins) and fails every posted
// Recv. Messages that already arrived stay receivable.
func (p *peer) fail(err error) {
	var waiting []*recvReq
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = err
	p.errp.Store(&err)
	close(p.gone)
	for tag, q := range p.queues {
		waiting = append(waiting, q.posted...)
		clear(q.posted)
		q.posted = q.posted[:0]
		if q.empty() {
			delete(p.queues, tag)
		}
	}
	p.mu.Unlock()
	for _, r := range waiting {
		r.done <- err
	}
}

// failAcks ends the sends by reference still waiting for an
// acknowledgement; the reader calls it when the connection has ended, after
// which the peer copies nothing more from this process (see copyRemote).
func (p *peer) failAcks(err error) {
	p.mu.Lock()
	acks := make([]chan error, 0, len(p.acks))
	for id, ack := range p.acks {
		acks = append(acks, ack)
		delete(p.acks, id)
	}
	p.mu.Unlock()
	for _, ack := range acks {
		ack <- err
	}
}

// lostErr says why the link to p is gone: "tcp: rank 0: rank 1 " followed by
// format and args (whose %w verbs wrap the network's error), wrapping
// ErrPeerLost.
func (p *peer) lostErr(format string, args ...any) error {
	return p.lostAs(transport.ErrPeerLost, format, args...)
}

// lostAs is lostErr wrapping sentinel instead (ErrPeerAborted, itself an
// ErrPeerLost).
func (p *peer) lostAs(sentinel error, format string, args ...any) error {
	args = append([]any{p.t.rank, p.rank}, args...)
	return fmt.Errorf("tcp: rank %d: rank %d "+format+": %w", append(args, sentinel)...)
}

func (p *peer) mismatchErr(tag transport.Tag, got, want int) error {
	return fmt.Errorf("tcp: rank %d: message from rank %d under tag %#x is %d bytes but the receive buffer is %d bytes: %w",
		p.t.rank, p.rank, uint64(tag), got, want, transport.ErrMismatch)
}

// queue returns the queue for tag, creating it; p.mu must be held.
func (p *peer) queue(tag transport.Tag) *tagQueue {
	q := p.queues[tag]
	if q == nil {
		q = p.t.queues.Get().(*tagQueue)
		p.queues[tag] = q
	}
	return q
}

// tidy drops the queue for tag when it is empty; p.mu must be held.
func (p *peer) tidy(tag transport.Tag, q *tagQueue) {
	if q.empty() {
		delete(p.queues, tag)
		p.t.queues.Put(q)
	}
}

// ---- receiving ----

func (p *peer) recv(ctx context.Context, tag transport.Tag, buf []byte) error {
	p.mu.Lock()
	q := p.queues[tag]
	if q != nil && len(q.ready) > 0 {
		m := q.popReady()
		p.tidy(tag, q)
		ref, copying := m.ref, m.copying
		p.mu.Unlock()
		if ref.id != 0 && copying == nil {
			m.timer.Stop()
			return p.fetch(tag, ref, buf)
		}
		if copying != nil {
			<-copying // the timer is copying it into a buffer
		}
		return p.take(tag, m, buf)
	}
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return err
	}
	r := p.t.reqs.Get().(*recvReq)
	r.buf = buf
	q = p.queue(tag)
	q.posted = append(q.posted, r)
	p.mu.Unlock()
	select {
	case p.posted <- struct{}{}: // wake a reader waiting for this Recv
	default:
	}

	select {
	case err := <-r.done:
		ref := r.ref
		p.release(r)
		if err == nil && ref.id != 0 {
			return p.fetch(tag, ref, buf)
		}
		return err
	case <-ctx.Done():
	}
	p.mu.Lock()
	if q := p.queues[tag]; q != nil && q.removePosted(r) {
		p.tidy(tag, q)
		p.mu.Unlock()
		p.release(r)
		return p.t.ctxErr(ctx, "recv", p.rank, tag)
	}
	p.mu.Unlock()
	// The reader has taken the request: its message is streaming into buf.
	// Give it a moment; then cut the connection so buf is released.
	timer := time.NewTimer(recvGrace)
	defer timer.Stop()
	var err error
	select {
	case err = <-r.done:
	case <-timer.C:
		p.fail(p.lostErr("was cut off: a receive timed out while its message was streaming in"))
		if p.conn != nil {
			p.conn.SetReadDeadline(time.Unix(1, 0))
		}
		err = <-r.done
	}
	ref := r.ref
	p.release(r)
	if err == nil && ref.id != 0 {
		// A message by reference: copying it cannot stall, so take it.
		err = p.fetch(tag, ref, buf)
	}
	if err == nil {
		return nil // the message made it after all
	}
	return p.t.ctxErr(ctx, "recv", p.rank, tag)
}

func (p *peer) release(r *recvReq) {
	r.buf = nil
	r.ref = remoteRef{}
	p.t.reqs.Put(r)
}

// take hands a buffered message to a Recv.
func (p *peer) take(tag transport.Tag, m *message, buf []byte) error {
	defer p.t.msgs.put(m)
	if m.err != nil {
		return m.err
	}
	if len(m.data) != len(buf) {
		return p.mismatchErr(tag, len(m.data), len(buf))
	}
	copy(buf, m.data)
	return nil
}

// deliverLocal is Send to oneself: the payload is copied to the posted Recv
// or into a buffered message.
func (p *peer) deliverLocal(tag transport.Tag, buf []byte) error {
	p.mu.Lock()
	if q := p.queues[tag]; q != nil && len(q.posted) > 0 {
		r := q.popPosted()
		p.tidy(tag, q)
		p.mu.Unlock()
		if len(r.buf) != len(buf) {
			r.done <- p.mismatchErr(tag, len(buf), len(r.buf))
			return nil
		}
		copy(r.buf, buf)
		r.done <- nil
		return nil
	}
	m := p.t.msgs.get(len(buf))
	copy(m.data, buf)
	q := p.queue(tag)
	q.ready = append(q.ready, m)
	p.mu.Unlock()
	return nil
}

// readLoop demultiplexes the frames of one connection until it ends.
func (p *peer) readLoop() {
	defer p.t.readers.Done()
	err := p.readFrames()
	p.fail(err)
	p.failAcks(p.goneErr())
	// Answer a goodbye or an abort by closing our side too, so the peer's
	// reader sees the end of the stream.
	p.shutdownWrite(0, nil)
}

func (p *peer) readErr(err error) error {
	if p.t.downErr() != nil {
		return p.t.downErr()
	}
	if gone := p.goneErr(); gone != nil {
		return gone // the link was cut for a reason already given (say, an unresponsive peer)
	}
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return p.lostErr("closed the connection without saying goodbye (did its process exit or crash?): %w", err)
	case errors.Is(err, syscall.ETIMEDOUT):
		return p.unresponsiveErr(p.lastHeard(), err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return p.lostErr("connection was cut: %w", err)
	default:
		return p.lostErr("connection failed: %w", err)
	}
}

func (p *peer) readFrames() error {
	for {
		if _, err := io.ReadFull(p.rd, p.rhdr[:]); err != nil {
			return p.readErr(err)
		}
		kind, tag, n := parseHeader(&p.rhdr)
		switch kind {
		case frameData:
			if err := p.deliver(tag, n); err != nil {
				return err
			}
		case frameRef:
			if _, err := io.ReadFull(p.rd, p.rref[:]); err != nil {
				return p.readErr(err)
			}
			if err := p.deliverRef(tag, n); err != nil {
				return err
			}
		case frameAck:
			p.acknowledged(uint64(tag), n)
		case frameHeartbeat:
			p.heartbeatAsked(n)
		case frameAbort:
			text := make([]byte, min(n, maxCauseLen))
			if _, err := io.ReadFull(p.rd, text); err != nil {
				return p.readErr(err)
			}
			return p.lostAs(transport.ErrPeerAborted, "aborted: %s", text)
		case frameBye:
			return p.lostErr("closed its transport")
		default:
			return p.lostErr("sent a frame of unknown kind %d (protocol error)", kind)
		}
	}
}

// deliver reads one data payload of n bytes under tag.
func (p *peer) deliver(tag transport.Tag, n uint64) error {
	if n > uint64(p.t.maxMsg) {
		if n > maxDiscard {
			return p.lostErr("sent a frame of %d bytes (protocol error)", n)
		}
		// The sender has a larger limit than we do: drop the payload and fail
		// the receive that would have taken it.
		if _, err := p.rd.Discard(int(n)); err != nil {
			return p.readErr(err)
		}
		tooLarge := fmt.Errorf("tcp: rank %d: rank %d sent %d bytes under tag %#x, above this rank's message limit of %d bytes; give every rank the same MaxMessage: %w",
			p.t.rank, p.rank, n, uint64(tag), p.t.maxMsg, transport.ErrTooLarge)
		p.handOver(tag, &message{err: tooLarge})
		return nil
	}
	size := int(n)
	p.mu.Lock()
	if p.t.downErr() != nil {
		p.mu.Unlock()
		if _, err := p.rd.Discard(size); err != nil {
			return p.readErr(err)
		}
		return nil
	}
	if q := p.queues[tag]; q != nil && len(q.posted) > 0 {
		r := q.popPosted()
		p.tidy(tag, q)
		p.mu.Unlock()
		return p.readInto(r, tag, size)
	}
	p.mu.Unlock()
	if size >= stealMin {
		// Leave a large payload in the socket for a moment: its Recv is
		// usually about to be posted, and then it lands directly in the
		// receive buffer instead of being copied out of ours.
		if r := p.awaitRecv(tag); r != nil {
			return p.readInto(r, tag, size)
		}
	}
	m := p.t.msgs.get(size)
	if size < stealMin {
		if _, err := io.ReadFull(p.rd, m.data); err != nil {
			return p.readErr(err)
		}
		p.handOver(tag, m)
		return nil
	}
	// Read what has arrived so far; after each read, a Recv posted meanwhile
	// takes over: what is buffered is copied once and the rest of the
	// payload goes straight into its buffer.
	for got := 0; got < size; {
		n, err := p.rd.Read(m.data[got:])
		got += n
		if err != nil && got < size {
			return p.readErr(err)
		}
		if got == size {
			break
		}
		p.mu.Lock()
		q := p.queues[tag]
		if q == nil || len(q.posted) == 0 {
			p.mu.Unlock()
			continue
		}
		r := q.popPosted()
		p.tidy(tag, q)
		p.mu.Unlock()
		if len(r.buf) != size {
			p.t.msgs.put(m)
			if _, err := p.rd.Discard(size - got); err != nil {
				err = p.readErr(err)
				r.done <- err
				return err
			}
			r.done <- p.mismatchErr(tag, size, len(r.buf))
			return nil
		}
		copy(r.buf, m.data[:got])
		p.t.msgs.put(m)
		if _, err := io.ReadFull(p.rd, r.buf[got:]); err != nil {
			err = p.readErr(err)
			r.done <- err
			return err
		}
		r.done <- nil
		return nil
	}
	p.handOver(tag, m)
	return nil
}

// readInto reads a payload of size bytes for the posted Recv r.
func (p *peer) readInto(r *recvReq, tag transport.Tag, size int) error {
	if len(r.buf) != size {
		if _, err := p.rd.Discard(size); err != nil {
			err = p.readErr(err)
			r.done <- err
			return err
		}
		r.done <- p.mismatchErr(tag, size, len(r.buf))
		return nil
	}
	// The Recv is waiting: read straight into its buffer.
	if _, err := io.ReadFull(p.rd, r.buf); err != nil {
		err = p.readErr(err)
		r.done <- err
		return err
	}
	r.done <- nil
	return nil
}

// awaitRecv waits up to recvWait for a Recv on tag to be posted and claims
// it; nil when none came. Messages behind this one wait meanwhile, which is
// why the wait is short: a Recv that is never posted before a later message
// is received costs recvWait once, not a deadlock.
func (p *peer) awaitRecv(tag transport.Tag) *recvReq {
	p.waitTimer.Reset(recvWait)
	defer p.waitTimer.Stop()
	for {
		select {
		case <-p.posted:
		case <-p.waitTimer.C:
			return nil
		case <-p.gone:
			return nil
		}
		p.mu.Lock()
		if q := p.queues[tag]; q != nil && len(q.posted) > 0 {
			r := q.popPosted()
			p.tidy(tag, q)
			p.mu.Unlock()
			return r
		}
		p.mu.Unlock()
	}
}

// handOver gives an arrived message to the first posted Recv, or queues it.
func (p *peer) handOver(tag transport.Tag, m *message) {
	p.mu.Lock()
	if q := p.queues[tag]; q != nil && len(q.posted) > 0 {
		r := q.popPosted()
		p.tidy(tag, q)
		p.mu.Unlock()
		r.done <- p.take(tag, m, r.buf)
		return
	}
	q := p.queue(tag)
	q.ready = append(q.ready, m)
	p.mu.Unlock()
}

// ---- sending ----

func (p *peer) lock(ctx context.Context) bool {
	select {
	case p.wsem <- struct{}{}:
		return true
	default:
	}
	select {
	case p.wsem <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-p.gone:
	}
	return false
}

func (p *peer) unlock() { <-p.wsem }

func (p *peer) send(ctx context.Context, tag transport.Tag, buf []byte) error {
	if p.refOut && len(buf) >= refMin {
		return p.sendRef(ctx, tag, buf)
	}
	return p.writeFrame(ctx, frameData, tag, uint64(len(buf)), buf, 0)
}

// writeFrame writes one frame: a header of kind, tag and n, then body; or,
// for a reference frame (refID not 0), body's address and refID.
func (p *peer) writeFrame(ctx context.Context, kind byte, tag transport.Tag, n uint64, body []byte, refID uint64) error {
	if err := p.goneErr(); err != nil {
		return err
	}
	if !p.lock(ctx) {
		if err := p.goneErr(); err != nil {
			return err
		}
		return p.t.ctxErr(ctx, "send", p.rank, tag)
	}
	defer p.unlock()
	if err := p.goneErr(); err != nil {
		return err
	}
	putHeader(&p.whdr, kind, tag, n)
	p.wvec[0], p.wvec[1] = p.whdr[:], body
	if refID != 0 {
		binary.LittleEndian.PutUint64(p.wref[0:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(body)))))
		binary.LittleEndian.PutUint64(p.wref[8:], refID)
		p.wvec[1] = p.wref[:]
	}
	p.wbufs = p.wvec[:]
	// A write blocks only while the peer's socket is full; should ctx end
	// (deadline or cancellation) meanwhile, cutSend interrupts it. Setting a
	// write deadline per message instead would cost two timer updates.
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, p.cutSend)
	}
	total := int64(headerSize + len(p.wvec[1]))
	written, err := p.wbufs.WriteTo(p.conn)
	if stop != nil && !stop() {
		<-p.cutDone // let the cut finish before clearing its deadline
		p.conn.SetWriteDeadline(time.Time{})
	}
	p.wvec[1] = nil
	p.wbufs = nil
	if err == nil && written == total {
		p.sent.Store(true)
		return nil
	}
	if ctx.Err() != nil {
		if written > 0 {
			// Half a frame is on the wire: the stream cannot be resumed.
			p.fail(p.lostErr("was cut off: a send timed out halfway through a message"))
			p.cutConn()
		}
		return p.t.ctxErr(ctx, "send", p.rank, tag)
	}
	if derr := p.t.downErr(); derr != nil {
		return derr
	}
	lost := p.lostErr("connection failed while sending: %w", err)
	if errors.Is(err, syscall.ETIMEDOUT) {
		lost = p.unresponsiveErr(p.lastHeard(), err)
	}
	p.fail(lost)
	p.cutConn()
	return p.goneErr()
}

// cutConn shuts the connection down in both directions without closing the
// descriptor (Close does that once the reader has exited).
func (p *peer) cutConn() {
	p.conn.SetReadDeadline(time.Unix(1, 0))
	p.conn.CloseWrite()
}

// shutdownWrite ends our side of the stream: it writes a final frame of kind
// (none when 0) with payload, then half-closes the connection. A writer that
// holds the line longer than writerGrace is cut off first.
func (p *peer) shutdownWrite(kind byte, payload []byte) {
	timer := time.NewTimer(writerGrace)
	defer timer.Stop()
	select {
	case p.wsem <- struct{}{}:
	case <-timer.C:
		p.conn.SetWriteDeadline(time.Unix(1, 0))
		p.wsem <- struct{}{}
		kind = 0 // the stream may hold half a frame: send nothing more
	}
	defer p.unlock()
	if p.wclosed {
		return
	}
	p.wclosed = true
	if kind != 0 {
		putHeader(&p.whdr, kind, 0, uint64(len(payload)))
		p.conn.SetWriteDeadline(time.Now().Add(writerGrace))
		bufs := net.Buffers{p.whdr[:], payload}
		bufs.WriteTo(p.conn)
	}
	p.conn.CloseWrite()
}
