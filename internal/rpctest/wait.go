package rpctest

import (
	"runtime"
	"testing"
	"time"
)

// Eventually polls cond every 5 ms until it holds, and fails the test with
// "timed out waiting until <what>" if it still does not after 10 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// CheckGoroutines waits up to 10 s for the number of goroutines to come back
// to at most before+2 (before is runtime.NumGoroutine() taken at the start of
// the test) and otherwise fails the test with every goroutine's stack.
func CheckGoroutines(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+2 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after\n%s", before, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
