package local

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
)

// hub joins the endpoints of one in-process world.
type hub struct {
	eps []*endpoint
}

// NewTransports returns the n transports of a world whose ranks are
// goroutines of this process: transports[r] is rank r's.
func NewTransports(n int) ([]transport.Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("local: world size %d; need at least 1: %w", n, transport.ErrInvalidArgument)
	}
	h := newHub(n)
	ts := make([]transport.Transport, n)
	for i, ep := range h.eps {
		ts[i] = ep
	}
	return ts, nil
}

func newHub(n int) *hub {
	h := &hub{eps: make([]*endpoint, n)}
	for r := range h.eps {
		h.eps[r] = &endpoint{hub: h, rank: r, queues: map[key]*queue{}, lost: make([]error, n)}
	}
	return h
}

type key struct {
	src int
	tag transport.Tag
}

// queue holds, for one (source, tag), either messages that arrived before a
// receive (msgs) or receives posted before their message (waiters); never
// both.
type queue struct {
	msgs    []*[]byte
	waiters []*waiter
}

type waiter struct {
	buf  []byte
	done chan error // buffered 1; written once, under the endpoint's lock
}

// endpoint is one rank's transport.
type endpoint struct {
	hub  *hub
	rank int

	mu     sync.Mutex
	queues map[key]*queue
	lost   []error // per source: why it is gone (aborted or closed), nil while alive
	dead   error   // this endpoint's own abort or close
}

func (e *endpoint) Rank() int { return e.rank }

func (e *endpoint) Size() int { return len(e.hub.eps) }

// OneHost reports true: in-process ranks share one host
// (transport.OneHost).
func (e *endpoint) OneHost() bool { return true }

func (e *endpoint) checkPeer(peer int) error {
	if peer < 0 || peer >= len(e.hub.eps) {
		return fmt.Errorf("local: rank %d: peer %d is outside the world of %d ranks: %w", e.rank, peer, len(e.hub.eps), transport.ErrInvalidArgument)
	}
	return nil
}

// opName names a Send or Recv in errors: "local: recv: rank 1 from rank 0
// (tag 0x5)".
func (e *endpoint) opName(op string, peer int, tag transport.Tag) string {
	dir := "to"
	if op == "recv" {
		dir = "from"
	}
	return fmt.Sprintf("local: %s: rank %d %s rank %d (tag %#x)", op, e.rank, dir, peer, uint64(tag))
}

// Send copies buf into peer's mailbox (straight into a waiting receive's
// buffer when one is posted), so it never waits for the receiver.
func (e *endpoint) Send(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	if err := errs.CheckContext(ctx, "local", "send"); err != nil {
		return err
	}
	if err := e.checkPeer(peer); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return errs.FromContext(ctx, e.opName("send", peer, tag))
	}
	e.mu.Lock()
	dead := e.dead
	e.mu.Unlock()
	if dead != nil {
		return dead
	}
	return e.hub.eps[peer].deliver(e.rank, tag, buf)
}

// deliver hands a message from src to this endpoint.
func (e *endpoint) deliver(src int, tag transport.Tag, buf []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead != nil {
		return fmt.Errorf("local: rank %d sending to rank %d: %w: %w", src, e.rank, e.dead, lostAs(e.dead))
	}
	k := key{src, tag}
	q := e.queues[k]
	if q != nil && len(q.waiters) > 0 {
		w := q.waiters[0]
		q.waiters = q.waiters[1:]
		if len(q.waiters) == 0 {
			delete(e.queues, k)
		}
		w.done <- fill(w.buf, buf, src, e.rank, tag)
		return nil
	}
	if q == nil {
		q = &queue{}
		e.queues[k] = q
	}
	q.msgs = append(q.msgs, copyMessage(buf))
	return nil
}

// Messages that wait for their receive are copied into pooled buffers, which
// the receive returns to the pool.
var msgPool sync.Pool // of *[]byte

func copyMessage(b []byte) *[]byte {
	p, _ := msgPool.Get().(*[]byte)
	if p == nil || cap(*p) < len(b) {
		if p != nil {
			msgPool.Put(p)
		}
		m := make([]byte, len(b))
		p = &m
	}
	*p = (*p)[:len(b)]
	copy(*p, b)
	return p
}

// fill copies a message into a receive buffer of the same length.
func fill(dst, msg []byte, src, dstRank int, tag transport.Tag) error {
	if len(dst) != len(msg) {
		return fmt.Errorf("local: rank %d received %d bytes from rank %d under tag %#x but its receive buffer holds %d bytes: %w",
			dstRank, len(msg), src, uint64(tag), len(dst), transport.ErrMismatch)
	}
	copy(dst, msg)
	return nil
}

func (e *endpoint) Recv(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	if err := errs.CheckContext(ctx, "local", "recv"); err != nil {
		return err
	}
	if err := e.checkPeer(peer); err != nil {
		return err
	}
	e.mu.Lock()
	if e.dead != nil {
		err := e.dead
		e.mu.Unlock()
		return err
	}
	k := key{peer, tag}
	q := e.queues[k]
	if q != nil && len(q.msgs) > 0 {
		msg := q.msgs[0]
		q.msgs[0] = nil
		q.msgs = q.msgs[1:]
		if len(q.msgs) == 0 {
			delete(e.queues, k)
		}
		e.mu.Unlock()
		err := fill(buf, *msg, peer, e.rank, tag)
		msgPool.Put(msg)
		return err
	}
	if e.lost[peer] != nil {
		err := e.lost[peer]
		e.mu.Unlock()
		return fmt.Errorf("local: rank %d receiving from rank %d: %w: %w", e.rank, peer, err, lostAs(err))
	}
	if ctx.Err() != nil {
		e.mu.Unlock()
		return errs.FromContext(ctx, e.opName("recv", peer, tag))
	}
	w := &waiter{buf: buf, done: make(chan error, 1)}
	if q == nil {
		q = &queue{}
		e.queues[k] = q
	}
	q.waiters = append(q.waiters, w)
	e.mu.Unlock()

	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
	}
	// Withdraw the receive, unless a message or failure reached it first
	// (then its buffer is already written and the result stands).
	e.mu.Lock()
	if q := e.queues[k]; q != nil {
		for i, x := range q.waiters {
			if x == w {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				if len(q.waiters) == 0 && len(q.msgs) == 0 {
					delete(e.queues, k)
				}
				e.mu.Unlock()
				return errs.FromContext(ctx, e.opName("recv", peer, tag))
			}
		}
	}
	e.mu.Unlock()
	return <-w.done
}

// Abort fails this endpoint's pending and future operations with cause and
// tells every peer that this rank is lost.
func (e *endpoint) Abort(cause error) {
	if cause == nil {
		cause = fmt.Errorf("local: rank %d aborted: %w", e.rank, transport.ErrClosed)
	}
	err := &abortErr{fmt.Errorf("local: rank %d aborted: %w", e.rank, cause)}
	e.shutdown(err, err)
}

// abortErr is an endpoint's abort, which its peers see as ErrPeerAborted
// (lostAs).
type abortErr struct{ err error }

func (a *abortErr) Error() string { return a.err.Error() }
func (a *abortErr) Unwrap() error { return a.err }

// lostAs is the sentinel that the loss of a peer for why wraps:
// ErrPeerAborted when the peer aborted, ErrPeerLost otherwise.
func lostAs(why error) error {
	var a *abortErr
	if errors.As(why, &a) {
		return transport.ErrPeerAborted
	}
	return transport.ErrPeerLost
}

// Close fails pending operations with ErrClosed; peers see this rank as lost
// once they have drained the messages it sent.
func (e *endpoint) Close() error {
	e.shutdown(fmt.Errorf("local: rank %d's transport was closed: %w", e.rank, transport.ErrClosed),
		fmt.Errorf("local: rank %d closed its transport", e.rank))
	return nil
}

func (e *endpoint) shutdown(self, toPeers error) {
	e.mu.Lock()
	if e.dead != nil {
		e.mu.Unlock()
		return
	}
	e.dead = self
	for k, q := range e.queues {
		for _, w := range q.waiters {
			w.done <- self
		}
		delete(e.queues, k)
	}
	e.mu.Unlock()
	for _, p := range e.hub.eps {
		if p != e {
			p.peerLost(e.rank, toPeers)
		}
	}
}

// peerLost records that src is gone and fails receives waiting on it.
func (e *endpoint) peerLost(src int, why error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lost[src] != nil {
		return
	}
	e.lost[src] = why
	for k, q := range e.queues {
		if k.src != src || len(q.waiters) == 0 {
			continue
		}
		for _, w := range q.waiters {
			w.done <- fmt.Errorf("local: rank %d receiving from rank %d: %w: %w", e.rank, src, why, lostAs(why))
		}
		delete(e.queues, k)
	}
}
