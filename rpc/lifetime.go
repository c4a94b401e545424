package rpc

import (
	"context"
	"sync"
	"time"
)

// lifetime runs the goroutines tied to an agent's life: the accept loop,
// the handshakes, the connections' read loops and liveness watches, and
// the work that packages built on rpc start with Agent.Go. They all see one
// context, cancelled when the agent closes; end refuses new goroutines from
// then on and waits for the running ones to return.
type lifetime struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	ended bool
	wg    sync.WaitGroup
}

func newLifetime() *lifetime {
	l := &lifetime{}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// goThen runs fn on a new goroutine counted in the lifetime, unless the
// lifetime has ended; it reports whether fn was started. The function fn
// returns, if any, runs next on the same goroutine after it has left the
// count, so that end does not wait for it: a read loop hands its goroutine
// over to the handler of the call it read this way, the next frames being
// read by a new loop.
func (l *lifetime) goThen(fn func(ctx context.Context) (then func())) bool {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return false
	}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		then := func() func() {
			defer l.wg.Done()
			return fn(l.ctx)
		}()
		if then != nil {
			then()
		}
	}()
	return true
}

// goFunc runs fn like goThen, with nothing after it.
func (l *lifetime) goFunc(fn func(ctx context.Context)) bool {
	return l.goThen(func(ctx context.Context) func() {
		fn(ctx)
		return nil
	})
}

// stop cancels the lifetime's context and refuses new goroutines, without
// waiting.
func (l *lifetime) stop() {
	l.mu.Lock()
	l.ended = true
	l.mu.Unlock()
	l.cancel()
}

// end stops the lifetime and waits for its goroutines, for at most
// patience; it reports whether they all returned.
func (l *lifetime) end(patience time.Duration) bool {
	l.stop()
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(patience)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
