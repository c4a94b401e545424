package futex

import (
	"testing"
	"time"
)

// TestPoll: no poll at all for a spin of zero, true once the condition
// holds, and false, after about spin, for one that never does.
func TestPoll(t *testing.T) {
	looks := 0
	if Poll(0, func() bool { looks++; return true }) || looks != 0 {
		t.Fatalf("spin 0: polled %d times, want none and false", looks)
	}
	looks = 0
	if !Poll(time.Second, func() bool { looks++; return looks == 20 }) || looks != 20 {
		t.Fatalf("a condition true at look 20: %d looks", looks)
	}
	start := time.Now()
	if Poll(2*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds: Poll reported true")
	}
	if d := time.Since(start); d < 2*time.Millisecond {
		t.Fatalf("gave up after %v, before the 2 ms spin", d)
	}
}
