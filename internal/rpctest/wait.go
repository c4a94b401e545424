package rpctest

import (
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
