package sgemm

import "testing"

// TestThreadsFor: the variable wins when it is a positive integer; else the
// processors are shared among the local ranks; else eight.
func TestThreadsFor(t *testing.T) {
	for _, c := range []struct {
		set, local string
		procs      int
		want       int
	}{
		{"3", "2", 16, 3},
		{"", "2", 16, 8},
		{"", "4", 2, 1},
		{"", "1", 16, 16},
		{"", "", 16, 8},
		{"0", "2", 8, 4},
		{"-1", "", 8, 8},
		{"many", "x", 8, 8},
	} {
		if got := threadsFor(c.set, c.local, c.procs); got != c.want {
			t.Errorf("threadsFor(%q, %q, %d) = %d, want %d", c.set, c.local, c.procs, got, c.want)
		}
	}
}
