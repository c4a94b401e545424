package tcp_test

import (
	"testing"

	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/tcp"
)

// TestConformance runs comm's backend conformance suite over real TCP
// transports on loopback: every rank is a goroutine owning its own
// transport, with its own sockets, reader goroutines and handshake.
func TestConformance(t *testing.T) {
	commtest.RunConformance(t, commtest.Connect(tcp.NewBackend(tcp.WithHost("127.0.0.1"))))
}
