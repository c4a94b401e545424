package tcp

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
)

// peerEnv makes a re-executed test binary act as rank 1 of
// BenchmarkPingPongProcess, reaching rank 0's store at the given address.
const peerEnv = "TANDEM_TCP_BENCH_PEER"

// TestHelperPingPongPeer is not a test: it is rank 1 of
// BenchmarkPingPongProcess, in its own process. It echoes messages until
// its peer goes away.
func TestHelperPingPongPeer(t *testing.T) {
	addr := os.Getenv(peerEnv)
	if addr == "" {
		t.Skip("peer process for BenchmarkPingPongProcess")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 1, Size: 2, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	size, _ := strconv.Atoi(os.Getenv(peerEnv + "_SIZE"))
	buf := make([]byte, size)
	for {
		if tr.Recv(context.Background(), 0, 1, buf) != nil || tr.Send(context.Background(), 0, 2, buf) != nil {
			os.Exit(0)
		}
	}
}

// BenchmarkPingPongProcess measures the round trip of a 4 KiB message
// between two processes, the latency floor under every small collective.
func BenchmarkPingPongProcess(b *testing.B) {
	const size = 4096
	ctx := context.Background()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPingPongPeer$")
	cmd.Env = append(os.Environ(), peerEnv+"="+st.Addr(), peerEnv+"_SIZE="+strconv.Itoa(size))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 0, Size: 2, Store: st, Timeout: 30 * time.Second})
	if err != nil {
		cmd.Process.Kill()
		b.Fatal(err)
	}
	defer tr.Close()
	buf := make([]byte, size)
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
