package admit

import (
	"net"
	"sync"
	"time"
)

// Conns holds a server's live connections and counts the goroutines that
// serve them, so that Close can drop every connection and wait until each
// goroutine is gone. The zero value is ready to use; T is the server's
// connection type.
type Conns[T comparable] struct {
	mu     sync.Mutex
	closed bool
	set    map[T]struct{}
	wg     sync.WaitGroup
}

// Serve records c and runs serve on a goroutine of its own, then forgets c
// when serve returns. It returns false, and runs nothing, once Close was
// called: the caller closes c itself.
func (s *Conns[T]) Serve(c T, serve func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.set == nil {
		s.set = map[T]struct{}{}
	}
	s.set[c] = struct{}{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.forget(c)
		serve()
	}()
	return true
}

func (s *Conns[T]) forget(c T) {
	s.mu.Lock()
	delete(s.set, c)
	s.mu.Unlock()
}

// All returns the connections live now.
func (s *Conns[T]) All() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]T, 0, len(s.set))
	for c := range s.set {
		out = append(out, c)
	}
	return out
}

// Len returns the number of connections live now.
func (s *Conns[T]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.set)
}

// Close refuses every later Serve and returns the connections live now, for
// the caller to close; Wait then waits until their goroutines are gone.
func (s *Conns[T]) Close() []T {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.All()
}

// Wait waits until the goroutine of every connection that Serve started has
// returned.
func (s *Conns[T]) Wait() { s.wg.Wait() }

// Accept accepts connections on ln and hands each to serve, until done is
// closed (the server's Close closes done, then ln). An Accept that fails
// while done is still open (out of file descriptors, say) is warned about
// through warn, as "<server>: accept failed; retrying", and retried after a
// pause that doubles up to a second.
func Accept(ln net.Listener, done <-chan struct{}, warn *Warner, server string, serve func(net.Conn)) {
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if err == nil {
			backoff = time.Millisecond
			serve(c)
			continue
		}
		select {
		case <-done:
			return
		default:
		}
		warn.Warn(server+": accept failed; retrying", "addr", ln.Addr().String(), "err", err, "retry_in", backoff)
		select {
		case <-done:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}
