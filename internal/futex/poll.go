package futex

import "time"

// Poll looks at cond until it holds or, for spin (checked every eighth
// look, to keep the clock off the common path), has not; between looks it
// yields (Yield), so that the process's other goroutines (a backward pass,
// the next bucket's copy) and the other threads on its CPU run meanwhile.
// It reports whether cond held; a caller that gets false sleeps on a futex
// word.
func Poll(spin time.Duration, cond func() bool) bool {
	if spin <= 0 {
		return false
	}
	start := time.Now()
	for i := 1; ; i++ {
		Yield()
		if cond() {
			return true
		}
		if i&7 == 0 && time.Since(start) > spin {
			return false
		}
	}
}
