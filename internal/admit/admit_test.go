package admit

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func tcpAddr(ip string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: port} }

func TestGateCapsTotalAndPerHost(t *testing.T) {
	g := NewGate(5, 3)
	var dones []func()
	for i := range 3 {
		d, ok := g.Admit(tcpAddr("10.0.0.1", 1000+i))
		if !ok {
			t.Fatalf("connection %d from the first host refused under the per-host cap", i)
		}
		dones = append(dones, d)
	}
	if _, ok := g.Admit(tcpAddr("10.0.0.1", 2000)); ok {
		t.Fatal("a fourth connection from one host was admitted over a per-host cap of 3")
	}
	for i := range 2 {
		d, ok := g.Admit(tcpAddr("10.0.0.2", 1000+i))
		if !ok {
			t.Fatalf("connection %d from the second host refused under the total cap", i)
		}
		dones = append(dones, d)
	}
	if _, ok := g.Admit(tcpAddr("10.0.0.3", 1)); ok {
		t.Fatal("a sixth connection was admitted over a total cap of 5")
	}
	if g.Pending() != 5 || g.Refused() != 2 {
		t.Fatalf("pending %d refused %d, want 5 and 2", g.Pending(), g.Refused())
	}
	dones[0]()
	dones[0]() // a second call must not free another slot
	if g.Pending() != 4 {
		t.Fatalf("pending %d after one release (called twice), want 4", g.Pending())
	}
	if _, ok := g.Admit(tcpAddr("10.0.0.1", 3000)); !ok {
		t.Fatal("a freed per-host slot was not reusable")
	}
	for _, d := range dones[1:] {
		d()
	}
}

func TestGateConcurrent(t *testing.T) {
	g := NewGate(64, 64)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				if d, ok := g.Admit(tcpAddr("127.0.0.1", i*1000+j)); ok {
					d()
				}
			}
		}()
	}
	wg.Wait()
	if g.Pending() != 0 {
		t.Fatalf("pending %d after every slot was released", g.Pending())
	}
}

func TestWarnerRateLimits(t *testing.T) {
	var buf bytes.Buffer
	w := NewWarner(slog.New(slog.NewTextHandler(&buf, nil)), 50*time.Millisecond)
	for range 1000 {
		w.Warn("refused", "remote", "x")
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("1000 warnings in a burst wrote %d lines, want 1:\n%s", n, buf.String())
	}
	time.Sleep(60 * time.Millisecond)
	w.Warn("refused", "remote", "y")
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 2 {
		t.Fatalf("after the interval got %d lines, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "suppressed=999") {
		t.Fatalf("second line does not count the 999 left out:\n%s", out)
	}
}

func TestConnsServeCloseWait(t *testing.T) {
	var s Conns[int]
	release := make(chan struct{})
	for i := range 3 {
		if !s.Serve(i, func() { <-release }) {
			t.Fatalf("Serve(%d) refused before Close", i)
		}
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
	live := s.Close()
	if len(live) != 3 {
		t.Fatalf("Close returned %v, want the 3 live connections", live)
	}
	if s.Serve(9, func() { t.Error("served after Close") }) {
		t.Fatal("Serve accepted a connection after Close")
	}
	close(release)
	s.Wait()
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after the goroutines ended = %d, want 0", n)
	}
}
