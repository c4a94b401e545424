package comm

import (
	"context"
	"sync"
	"sync/atomic"
)

// Scratch buffers are pooled, so that steady-state collectives do not
// allocate their receive space.
var scratchPool sync.Pool // of *[]byte

func getScratch(n int) *[]byte {
	if p, ok := scratchPool.Get().(*[]byte); ok {
		if cap(*p) >= n {
			*p = (*p)[:n]
			return p
		}
		scratchPool.Put(p)
	}
	b := make([]byte, n)
	return &b
}

func putScratch(p *[]byte) {
	if p != nil {
		scratchPool.Put(p)
	}
}

// chunkBytes is the pipelining unit for elements of dt: the group's chunk
// size rounded down to whole elements, at least one element.
func (c *opCtx) chunkBytes(dt dtype) int {
	es := dt.size()
	return max(es, c.pg.opts.chunkSize/es*es)
}

func numChunks(b []byte, chunk int) int { return (len(b) + chunk - 1) / chunk }

func chunkOf(b []byte, i, chunk int) []byte {
	lo := i * chunk
	return b[lo:min(lo+chunk, len(b))]
}

// sendJob is one message for a sender goroutine.
type sendJob struct {
	peer int
	step uint16
	b    []byte
}

// sender sends queued messages in order from its own goroutine, so that an
// algorithm receives (and reduces) while its previous chunk is on the wire.
type sender struct {
	jobs     chan sendJob
	done     chan struct{}
	err      error       // the first send's failure; read after done
	stopping atomic.Bool // body failed: drop what is left
}

// withSender runs body with a sender that can queue up to capacity messages
// without blocking. A failed send cancels body's context (and its error is
// returned); when body fails first, the sends still queued are dropped and
// body's error is returned.
func withSender(ctx context.Context, c *opCtx, capacity int, body func(ctx context.Context, s *sender) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &sender{jobs: make(chan sendJob, capacity), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for j := range s.jobs {
			if s.err != nil || s.stopping.Load() {
				continue
			}
			if err := c.send(ctx, j.peer, j.step, j.b); err != nil && !s.stopping.Load() {
				s.err = err
				cancel()
			}
		}
	}()
	err := body(ctx, s)
	if err != nil {
		s.stopping.Store(true)
		cancel()
	}
	close(s.jobs)
	<-s.done
	if s.err != nil {
		return s.err
	}
	return err
}

func (s *sender) push(peer int, step uint16, b []byte) { s.jobs <- sendJob{peer, step, b} }

// eagerExchange is the largest message that exchange sends before it
// receives, in one goroutine: transports buffer a message that arrives before
// its receive, and a small one is in the peer's socket (or mailbox) at once,
// so the send does not wait for the peer. Larger messages are sent and
// received concurrently (full duplex).
const eagerExchange = 64 << 10

// exchange sends out to sendTo and receives in from recvFrom.
func (c *opCtx) exchange(ctx context.Context, sendTo int, out []byte, recvFrom int, in []byte, step uint16) error {
	if len(out) <= eagerExchange {
		if err := c.send(ctx, sendTo, step, out); err != nil {
			return err
		}
		return c.recv(ctx, recvFrom, step, in)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.send(ctx, sendTo, step, out) }()
	rerr := c.recv(ctx, recvFrom, step, in)
	serr := <-errc
	if serr != nil {
		return serr
	}
	return rerr
}
