package rpc

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/wire"
)

// TestConnectToFrozenWorkerFails: a worker whose address accepts the
// connection (the kernel does) but never answers the handshake counts as
// unresponsive after twice the liveness timeout, not after the call's
// timeout.
func TestConnectToFrozenWorkerFails(t *testing.T) {
	agents := startGroup(t, 2, registerBasics, WithLivenessTimeout(300*time.Millisecond))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	agents[0].addrs[1] = ln.Addr().String()
	start := time.Now()
	_, err = Sync[int](context.Background(), agents[0], "w1", "add", [2]int{1, 1})
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "unresponsive") || !strings.Contains(err.Error(), "w1") {
		t.Fatalf("call to a worker that never answers the handshake: %v after %v", err, took)
	}
	if took > 5*time.Second {
		t.Fatalf("took %v, want about 600ms", took)
	}
}

// TestIdleConnectionStaysAlive: connections with nothing to carry stay up
// over many liveness timeouts, kept alive by heartbeats both ways, and
// heartbeats mixed with traffic (same-host copies included) change nothing.
func TestIdleConnectionStaysAlive(t *testing.T) {
	const timeout = 500 * time.Millisecond
	agents := startGroup(t, 2, registerSum, WithLivenessTimeout(timeout))
	ctx := context.Background()
	for i, a := range agents {
		if _, err := Sync[int](ctx, a, agents[1-i].Self().Name, "add", [2]int{1, 1}); err != nil {
			t.Fatal(err)
		}
	}
	c0, c1 := agents[0].peers[1].cur.Load(), agents[1].peers[0].cur.Load()
	rx0, rx1 := c0.readAt.Load(), c1.readAt.Load()
	time.Sleep(5 * timeout)
	if c0.dead.Load() || c1.dead.Load() || agents[0].peers[1].cur.Load() != c0 || agents[1].peers[0].cur.Load() != c1 {
		t.Fatal("an idle connection was dropped")
	}
	if c0.readAt.Load() == rx0 || c1.readAt.Load() == rx1 {
		t.Fatal("no heartbeat arrived on an idle connection")
	}
	// Traffic, large tensors by reference included, while heartbeats flow.
	n := cmaThreshold/4 + 1
	x := dense([]int{n}, make([]float32, n))
	x.Data().([]float32)[n-1] = 7
	deadline := time.Now().Add(3 * timeout)
	for time.Now().Before(deadline) {
		y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
		if err != nil || !sameTensor(x, y) {
			t.Fatalf("echo with heartbeats: %v", err)
		}
		if _, err := Async[float64](ctx, agents[1], "w0", "sum", x).Wait(ctx); err != nil {
			t.Fatalf("sum with heartbeats: %v", err)
		}
	}
	if agents[0].peers[1].cur.Load() != c0 || agents[1].peers[0].cur.Load() != c1 {
		t.Fatal("a busy connection was replaced")
	}
	for i, err := range shutdownAll(agents) {
		if err != nil {
			t.Fatalf("shutdown w%d: %v", i, err)
		}
	}
}

// TestHeartbeatFrame: a heartbeat is a bodiless frame of its own kind, and
// one that carries a body is malformed.
func TestHeartbeatFrame(t *testing.T) {
	b, _, err := wire.AppendHead(nil, &wire.Frame{Kind: wire.KindHeartbeat})
	if err != nil {
		t.Fatal(err)
	}
	f, err := wire.DecodeFrame(b, 1<<20, nil)
	if err != nil || f.Kind != wire.KindHeartbeat {
		t.Fatalf("heartbeat decodes to %+v, %v", f, err)
	}
	b, _, _ = wire.AppendHead(nil, &wire.Frame{Kind: wire.KindHeartbeat, Payload: []byte("x")})
	if _, err := wire.DecodeFrame(b, 1<<20, nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("heartbeat with a body: %v, want ErrMalformed", err)
	}
	b, _, _ = wire.AppendHead(nil, &wire.Frame{Kind: wire.KindHeartbeat + 1})
	if _, err := wire.DecodeFrame(b, 1<<20, nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("frame kind %d: %v, want ErrMalformed", wire.KindHeartbeat+1, err)
	}
}
