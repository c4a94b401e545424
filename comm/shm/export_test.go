package shm

import "time"

// SetHoldFor sets how long a held large frame waits for its receive until
// the returned function restores it (for TestOutOfOrderLarge).
func SetHoldFor(d time.Duration) (restore func()) {
	prev := holdFor
	holdFor = d
	return func() { holdFor = prev }
}
