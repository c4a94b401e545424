//go:build unix

package cputime

import "testing"

// TestProcessGrows: busy work shows as CPU time.
func TestProcessGrows(t *testing.T) {
	c0 := Process()
	x := 0.0
	for i := 0; Process() == c0 && i < 1e9; i++ {
		x += float64(i)
	}
	if Process() <= c0 {
		t.Fatalf("CPU time did not grow after busy work (%v)", x)
	}
}
