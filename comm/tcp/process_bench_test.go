package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/childtest"
)

// peerEnv makes a re-executed test binary act as rank 1 of
// BenchmarkPingPongProcess, reaching rank 0's store at the given address.
const peerEnv = "TANDEM_TCP_BENCH_PEER"

// pingPongSize is the size of the messages BenchmarkPingPongProcess sends.
const pingPongSize = 4096

// TestHelperPingPongPeer is not a test: it is rank 1 of
// BenchmarkPingPongProcess, in its own process. It echoes messages until
// its peer goes away.
func TestHelperPingPongPeer(t *testing.T) {
	childtest.Main(peerEnv, "ping-pong peer", func(_ context.Context, addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := store.NewTCP(ctx, addr, false)
		if err != nil {
			return err
		}
		defer st.Close()
		tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 1, Size: 2, Store: st})
		if err != nil {
			return err
		}
		defer tr.Close()
		buf := make([]byte, pingPongSize)
		for tr.Recv(context.Background(), 0, 1, buf) == nil && tr.Send(context.Background(), 0, 2, buf) == nil {
		}
		return nil
	})
}

// BenchmarkPingPongProcess measures the round trip of a 4 KiB message
// between two processes, the latency floor under every small collective.
func BenchmarkPingPongProcess(b *testing.B) {
	ctx := context.Background()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	childtest.Start(b, "the ping-pong peer", "TestHelperPingPongPeer", peerEnv+"="+st.Addr())
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 0, Size: 2, Store: st, Timeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	buf := make([]byte, pingPongSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := tr.Send(ctx, 1, 1, buf); err != nil {
			b.Fatal(err)
		}
		if err := tr.Recv(ctx, 1, 2, buf); err != nil {
			b.Fatal(err)
		}
	}
}
