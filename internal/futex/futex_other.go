//go:build !linux

package futex

import (
	"sync/atomic"
	"time"
)

// poll bounds a Wait where the system has no futex: the waiter looks
// again after it.
const poll = 50 * time.Microsecond

// Wait sleeps while *w == val, for at most d, looking again every 50 µs:
// this system has no futex for a waker to end the sleep early.
func Wait(w *atomic.Uint32, val uint32, d time.Duration) {
	deadline := time.Now().Add(d)
	for w.Load() == val && time.Now().Before(deadline) {
		time.Sleep(min(poll, time.Until(deadline)))
	}
}

// Wake does nothing: waiters look again on their own (see Wait).
func Wake(w *atomic.Uint32) {}
