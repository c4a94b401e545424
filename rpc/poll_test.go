package rpc

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		got <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-got
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// pollPair returns a pollReader polling for DefaultPoll on one end of a
// loopback TCP connection, and the other end.
func pollPair(t *testing.T) (*pollReader, net.Conn) {
	t.Helper()
	a, b := tcpPair(t)
	pr := newPollReader(a)
	if pr == nil {
		t.Skip("no pollable descriptor on this platform")
	}
	pr.spin.Store(int64(DefaultPoll))
	return pr, b
}

// TestPollReader: a polling read returns bytes that come while it polls and
// bytes that come after it parked, honours the read deadline, and reports
// the peer's close as EOF and its own connection's close as net.ErrClosed.
func TestPollReader(t *testing.T) {
	pr, b := pollPair(t)
	buf := make([]byte, 8)

	b.Write([]byte("now"))
	if n, err := io.ReadFull(pr, buf[:3]); err != nil || string(buf[:n]) != "now" {
		t.Fatalf("read while polling: %q, %v", buf[:n], err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // long past the poll: the read parks
		b.Write([]byte("later"))
	}()
	if n, err := io.ReadFull(pr, buf[:5]); err != nil || string(buf[:n]) != "later" {
		t.Fatalf("read after parking: %q, %v", buf[:n], err)
	}

	pr.nc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := pr.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want a deadline error", err)
	}
	pr.nc.SetReadDeadline(time.Time{})

	b.Close()
	if _, err := pr.Read(buf); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want io.EOF", err)
	}

	c, d := tcpPair(t)
	pc := newPollReader(c)
	pc.spin.Store(int64(time.Millisecond))
	go func() {
		time.Sleep(10 * time.Millisecond)
		c.Close()
	}()
	if _, err := pc.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a connection closed under it: %v, want net.ErrClosed", err)
	}
	_ = d
}

// TestNextPoll: the poll grows to twice a wait within the ceiling, never
// below its base or above the ceiling, shrinks by a sixty-fourth after a
// shorter wait, and drops back to the base after a wait past the ceiling.
func TestNextPoll(t *testing.T) {
	base := DefaultPoll
	for _, c := range []struct {
		waited, window, base, want time.Duration
	}{
		{0, base, base, base},
		{10 * time.Microsecond, base, base, base},
		{400 * time.Microsecond, base, base, 800 * time.Microsecond},
		{pollCeiling / 2, base, base, pollCeiling},
		{pollCeiling, base, base, pollCeiling},
		{pollCeiling + 1, base, base, base},
		{pollCeiling + 1, pollCeiling, base, base},
		{time.Second, base, base, base},
		{time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond, pollCeiling}, // the base still rules the poll (Read takes the larger)
		// A short wait after a long one: the window shrinks by a 64th.
		{20 * time.Microsecond, 640 * time.Microsecond, base, 630 * time.Microsecond},
		{20 * time.Microsecond, 60 * time.Microsecond, base, 60*time.Microsecond - 60*time.Microsecond/64},
		{400 * time.Microsecond, 640 * time.Microsecond, base, 800 * time.Microsecond},
	} {
		if got := nextPoll(c.waited, c.window, c.base); got != c.want {
			t.Errorf("nextPoll(%v, %v, %v) = %v, want %v", c.waited, c.window, c.base, got, c.want)
		}
	}
	// Alternating waits of 30 and 300 µs, as a large echo's frames come,
	// keep the window above the longer wait: no read of the pattern parks.
	w := base
	for i := 0; i < 1000; i++ {
		waited := 30 * time.Microsecond
		if i%2 == 1 {
			waited = 300 * time.Microsecond
		}
		if i > 1 && waited >= w {
			t.Fatalf("wait %d of %v outlasts its poll of %v", i, waited, w)
		}
		w = nextPoll(waited, w, base)
	}
}

// TestPollReaderAdapts: a read whose bytes came a fraction of a
// millisecond after it began leaves the next poll longer than the base and
// within the ceiling; a read that waited past the ceiling brings the poll
// back to its base.
func TestPollReaderAdapts(t *testing.T) {
	pr, b := pollPair(t)
	buf := make([]byte, 8)
	readLate := func(after time.Duration, what string) {
		t.Helper()
		go func() {
			time.Sleep(after)
			b.Write([]byte(what))
		}()
		if n, err := io.ReadFull(pr, buf[:len(what)]); err != nil || string(buf[:n]) != what {
			t.Fatalf("read %q: %q, %v", what, buf[:n], err)
		}
	}
	// The writer's sleep may overrun on a loaded machine, past the
	// ceiling: a few tries.
	grown := false
	for try := 0; try < 5 && !grown; try++ {
		readLate(300*time.Microsecond, "one")
		grown = pr.window > DefaultPoll && pr.window <= pollCeiling
	}
	if !grown {
		t.Fatalf("after waits of about 300 µs the poll lasts %v, want twice the wait (within %v..%v)", pr.window, DefaultPoll, pollCeiling)
	}
	readLate(20*time.Millisecond, "two")
	if pr.window != DefaultPoll {
		t.Fatalf("after a wait of 20 ms the poll lasts %v, want the base %v", pr.window, DefaultPoll)
	}
}

// TestOnOneHost: loopback connections count as one host; a connection with
// no TCP addresses does not.
func TestOnOneHost(t *testing.T) {
	a, _ := tcpPair(t)
	if !onOneHost(a, 0) {
		t.Error("a loopback connection is not taken for one host")
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if onOneHost(p, 0) {
		t.Error("a pipe with no TCP addresses is taken for one host")
	}
	if !onOneHost(p, 1234) {
		t.Error("a peer whose process id the kernel vouched for is not taken for one host")
	}
}

// TestWithPoll: connections between workers on this host poll for
// DefaultPoll, or for what WithPoll says (0: they park at once), on both
// ends, and calls of every size work either way.
func TestWithPoll(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"default", nil, DefaultPoll},
		{"off", []Option{WithPoll(0)}, 0},
		{"1ms", []Option{WithPoll(time.Millisecond)}, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agents := startGroup(t, 2, registerBasics, tc.opts...)
			ctx := context.Background()
			for _, n := range []int{1, 1 << 10, cmaThreshold} {
				for i := 0; i < 50; i++ {
					x := filled(n, float32(i))
					y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
					if err != nil {
						t.Fatal(err)
					}
					if !y.Eq(x) {
						t.Fatalf("echo of %d floats came back changed", n)
					}
				}
			}
			client := agents[0].peers[1].cur.Load()
			if client == nil || client.poll == nil {
				t.Fatal("the client connection has no polling reader")
			}
			if got := time.Duration(client.poll.spin.Load()); got != tc.want {
				t.Errorf("client connection polls for %v, want %v", got, tc.want)
			}
			agents[1].mu.Lock()
			defer agents[1].mu.Unlock()
			if len(agents[1].servers) == 0 {
				t.Fatal("the callee has no server connection")
			}
			for s := range agents[1].servers {
				if got := time.Duration(s.poll.spin.Load()); got != tc.want {
					t.Errorf("server connection polls for %v, want %v", got, tc.want)
				}
			}
		})
	}
}
