package shm_test

import (
	"testing"

	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/shm"
)

// TestConformance runs comm's backend conformance suite over shared-memory
// transports: every rank is a goroutine owning its own transport, with its
// own mapping of the world's segment, its own readers and heartbeat. Small
// rings make the suite's larger messages stream through them in pieces.
func TestConformance(t *testing.T) {
	commtest.RunConformance(t, commtest.Connect(shm.NewBackend(shm.WithRingBytes(64<<10))))
}
