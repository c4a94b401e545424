package tcp

import (
	"testing"
)

// BenchmarkConnectPair measures setting up a world of two ranks with a
// token: store rendezvous, handshake, same-host probe.
func BenchmarkConnectPair(b *testing.B) {
	for b.Loop() {
		st := newStore(b)
		ts, errs := connectWorld(2, st, nil)
		for r, err := range errs {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
		for _, tr := range ts {
			tr.Close()
		}
	}
}
