package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/samehost/samehosttest"
	"github.com/tandemml/tandem/internal/testkit"
)

// pushing makes a first large call from a to w1 and reports whether that
// connection pushes (same-host copies both ways, which this machine may
// not allow).
func pushing(t *testing.T, a *Agent) bool {
	t.Helper()
	if _, err := Sync[*tensor.Dense](context.Background(), a, "w1", "echo", filled(pushFrom/4, 0)); err != nil {
		t.Fatal(err)
	}
	c := a.peers[1].cur.Load()
	if c == nil || !c.pushOK {
		t.Skip("same-host copies are not available both ways here: nothing is pushed")
	}
	return true
}

func registerPush(rank int, reg *Registry) {
	registerBasics(rank, reg)
	must(Register(reg, "swap", func(ctx context.Context, ts []*tensor.Dense) ([]*tensor.Dense, error) {
		return []*tensor.Dense{ts[1], ts[0]}, nil
	}))
}

// pushed is the tensors both agents have pushed.
func pushed(agents []*Agent) int64 {
	return agents[0].Metrics().PushedTensors + agents[1].Metrics().PushedTensors
}

// TestPush: large tensors are pushed both ways once the first call of a
// size has granted memory, and arrive whole, call after call; a change of
// size revokes the grant and pushing resumes at the new size; frames with
// several tensors push the largest; the caller may change its tensor as
// soon as the call is sent.
func TestPush(t *testing.T) {
	agents := startGroup(t, 2, registerPush)
	pushing(t, agents[0])
	ctx := testkit.Context(t, 30*time.Second)
	for _, n := range []int{pushFrom / 4, pushFrom, 3 * pushFrom, pushFrom / 4} {
		before := pushed(agents)
		for i := 0; i < 6; i++ {
			x := filled(n, float32(i))
			y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
			if err != nil {
				t.Fatal(err)
			}
			if !sameTensor(x, y) {
				t.Fatalf("%d floats, call %d: the echo differs", n, i)
			}
		}
		// The first call of a size is copied by the receiver alone and
		// grants memory; the rest push both ways (the reply's grant came
		// with the first request).
		if got := pushed(agents) - before; got < 8 {
			t.Fatalf("%d floats: %d tensors pushed in 6 calls, want at least 8", n, got)
		}
	}
	// Two large tensors in a frame: one is pushed, both arrive.
	a, b := filled(pushFrom/4+3, 1), filled(pushFrom/4+5, 2)
	for i := 0; i < 4; i++ {
		out, err := Sync[[]*tensor.Dense](ctx, agents[1], "w0", "swap", []*tensor.Dense{a, b})
		if err != nil || len(out) != 2 || !sameTensor(out[0], b) || !sameTensor(out[1], a) {
			t.Fatalf("swap: %v", err)
		}
	}
	// The tensor may change once Async has returned.
	x := filled(pushFrom/4, 3)
	want := filled(pushFrom/4, 3)
	f := Async[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
	for i := range x.Float32s() {
		x.Float32s()[i] = -1
	}
	if y, err := f.Wait(ctx); err != nil || !sameTensor(y, want) {
		t.Fatalf("async echo after the tensor changed: %v", err)
	}
	// Many large calls at once, both ways.
	var futs []*Future[*tensor.Dense]
	for i := 0; i < 8; i++ {
		futs = append(futs, Async[*tensor.Dense](ctx, agents[i%2], []string{"w1", "w0"}[i%2], "echo", want))
	}
	for _, f := range futs {
		if y, err := f.Wait(ctx); err != nil || !sameTensor(y, want) {
			t.Fatalf("concurrent echo: %v", err)
		}
	}
}

// TestPushOff: with pushing off on either side no tensor is pushed, and
// large calls work as before.
func TestPushOff(t *testing.T) {
	for _, off := range []int{0, 1} {
		st := store.NewMemory()
		agents := mustInitEach(t, testkit.Context(t, 30*time.Second), 2, func(r int) (string, []Option) {
			reg := NewRegistry()
			registerPush(r, reg)
			opts := []Option{WithStore(st), WithRegistry(reg), WithListenAddr("127.0.0.1:0")}
			if r == off {
				opts = append(opts, WithPush(false))
			}
			return fmt.Sprintf("w%d", r), opts
		})
		t.Cleanup(func() { shutdownAll(agents); st.Close() })
		for i := 0; i < 4; i++ {
			x := filled(pushFrom/2, float32(i))
			if y, err := Sync[*tensor.Dense](context.Background(), agents[0], "w1", "echo", x); err != nil || !sameTensor(x, y) {
				t.Fatalf("push off on worker%d: echo %v", off, err)
			}
		}
		if n := pushed(agents); n != 0 {
			t.Fatalf("push off on worker%d: %d tensors pushed", off, n)
		}
	}
}

// TestPushLent: a call that lends memory for its reply gets the reply in
// that memory, not pushed, while its argument is still pushed.
func TestPushLent(t *testing.T) {
	agents := startGroup(t, 2, registerPush)
	pushing(t, agents[0])
	ctx := testkit.Context(t, 30*time.Second)
	into := filled(pushFrom/2, 0)
	addr := dataAddr(into)
	// A call of this size first: the callee revokes the grant of the size
	// pushing used and grants one of this size, a round trip of its own
	// that the next call may outrun; wait for the grant.
	if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", filled(pushFrom/2, 0)); err != nil {
		t.Fatal(err)
	}
	waitGrant(t, agents[0].peers[1].cur.Load(), 2*pushFrom)
	for i := 0; i < 5; i++ {
		x := filled(pushFrom/2, float32(i))
		before0, before1 := agents[0].Metrics().PushedTensors, agents[1].Metrics().PushedTensors
		y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x, WithResultInto(into))
		if err != nil || !sameTensor(x, y) {
			t.Fatalf("call %d: %v", i, err)
		}
		if dataAddr(y) != addr {
			t.Fatalf("call %d: the reply is not in the lent memory", i)
		}
		if n := agents[1].Metrics().PushedTensors - before1; n != 0 {
			t.Fatalf("call %d: the callee pushed a reply into lent memory", i)
		}
		if n := agents[0].Metrics().PushedTensors - before0; n != 1 {
			t.Fatalf("call %d: %d arguments pushed, want 1", i, n)
		}
	}
}

// waitGrant waits until c holds its peer's grant for a tensor of size
// bytes.
func waitGrant(t *testing.T, c *conn, size uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.grant.mu.Lock()
		g := c.grant.g
		c.grant.mu.Unlock()
		if g != nil && g.size >= size {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant for %d bytes within 10 s", size)
		}
	}
}

// TestPushGrantsSettleOnClose: memory granted and never used is let go by
// the peer when its connection closes (the completion word shows it), so
// that the quarantine can give it back.
func TestPushGrantsSettleOnClose(t *testing.T) {
	agents := startGroup(t, 2, registerPush)
	pushing(t, agents[0])
	ctx := testkit.Context(t, 30*time.Second)
	for i := 0; i < 3; i++ {
		if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", filled(pushFrom/2, 1)); err != nil {
			t.Fatal(err)
		}
	}
	var granted []*landing
	for _, a := range agents {
		a.mu.Lock()
		for c := range a.servers {
			c.land.mu.Lock()
			if c.land.out != nil {
				granted = append(granted, c.land.out)
			}
			c.land.mu.Unlock()
		}
		a.mu.Unlock()
		for _, p := range a.peers {
			if c := p.cur.Load(); c != nil {
				c.land.mu.Lock()
				if c.land.out != nil {
					granted = append(granted, c.land.out)
				}
				c.land.mu.Unlock()
			}
		}
	}
	if len(granted) < 2 {
		t.Fatalf("%d grants outstanding after echoes, want one each way", len(granted))
	}
	for _, l := range granted {
		if l.settled() {
			t.Fatal("an unused grant shows settled before the connection closed")
		}
	}
	for _, err := range shutdownAll(agents) {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range granted {
		if !l.settled() || l.status.Load() != pushRevoked {
			t.Fatalf("grant %d after close: word %d status %d, want settled and revoked", l.token, l.word.Load(), l.status.Load())
		}
	}
}

// TestReceiveWaitEnds: a receiver waiting for a push that never comes
// stops when its connection closes, or when the pushing process is gone,
// with ErrPeerLost; a push marked abandoned fails the frame; a failed push
// has the receiver copy the rest, whatever the tail word says.
func TestReceiveWaitEnds(t *testing.T) {
	agents := startGroup(t, 1, registerBasics)
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(pid int) (*conn, *landing) {
		c := &conn{a: agents[0], peer: agents[0].self, done: make(chan struct{}), peerPID: pid}
		l := &landing{token: 7}
		c.land.using = l
		return c, l
	}
	receive := func(c *conn, raw, src []byte) error {
		addr := uint64(0)
		if len(src) > 0 {
			addr = uint64(uintptr(unsafe.Pointer(&src[0])))
		}
		return (*connLandings)(c).Receive(7, raw, addr)
	}
	c, _ := mk(os.Getpid())
	time.AfterFunc(50*time.Millisecond, func() { close(c.done) })
	start := time.Now()
	if err := receive(c, nil, nil); !errors.Is(err, ErrPeerLost) || time.Since(start) > 5*time.Second {
		t.Fatalf("connection closed: %v after %v", err, time.Since(start))
	}
	c, _ = mk(gone.Process.Pid)
	if err := receive(c, nil, nil); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("pushing process gone: %v", err)
	}
	c, l := mk(os.Getpid())
	l.status.Store(pushAborted)
	l.word.Store(7)
	if err := receive(c, nil, nil); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("abandoned push: %v", err)
	}
	if !samehosttest.SelfReadable() {
		return
	}
	src := []byte("all of it, copied by the receiver")
	for _, status := range []uint64{pushFailed, pushDone} {
		c, l = mk(os.Getpid())
		l.status.Store(status)
		l.tail.Store(uint64(len(src))) // the sender claims it wrote it all
		l.word.Store(7)
		raw := make([]byte, len(src))
		if err := receive(c, raw, src); err != nil {
			t.Fatalf("status %d: %v", status, err)
		}
		copied := string(raw) == string(src)
		if copied != (status == pushFailed) {
			t.Fatalf("status %d: the receiver copied %q", status, raw)
		}
	}
	if err := receive(c, nil, nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a second wait on a landed grant: %v", err)
	}
}

// TestPushMeets: a pushed tensor's receiver and sender, one copying from
// the start and the other writing from the end, fill it whole, whichever
// starts first, however late the other comes; each leaves to the other
// what the other has done.
func TestPushMeets(t *testing.T) {
	if !samehosttest.SelfReadable() {
		t.Skip("this process may not read its own memory with process_vm_readv here")
	}
	agents := startGroup(t, 1, registerBasics)
	src := make([]byte, 5*pushPiece+12345)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	addr := uint64(uintptr(unsafe.Pointer(&src[0])))
	n := uint64(len(src))
	for _, tc := range []struct {
		name string
		// receiverFirst: the receiver has copied all it can, and waits,
		// when the sender starts; senderFirst: the sender is done when the
		// receiver starts; neither: both run at once.
		receiverFirst, senderFirst bool
	}{{name: "together"}, {name: "sender late", receiverFirst: true}, {name: "receiver late", senderFirst: true}} {
		t.Run(tc.name, func(t *testing.T) {
			recv := &conn{a: agents[0], peer: agents[0].self, done: make(chan struct{}), peerPID: os.Getpid()}
			send := &conn{a: agents[0], peer: agents[0].self, done: make(chan struct{}), peerPID: os.Getpid()}
			l := &landing{token: 9, mem: make([]byte, n)}
			recv.land.using = l
			g := &peerGrant{token: 9, addr: uint64(uintptr(unsafe.Pointer(&l.mem[0]))), word: uint64(uintptr(unsafe.Pointer(&l.word))), size: n}
			pushed := make(chan struct{})
			goPush := func() {
				go func() {
					send.pushTail(g, src)
					close(pushed)
				}()
			}
			if tc.senderFirst {
				goPush()
				<-pushed
			}
			if !tc.receiverFirst && !tc.senderFirst {
				goPush()
			}
			received := make(chan error, 1)
			go func() { received <- (*connLandings)(recv).Receive(9, l.mem, addr) }()
			if tc.receiverFirst {
				for l.front.Load() < n {
					time.Sleep(time.Millisecond)
				}
				goPush()
			}
			if err := <-received; err != nil {
				t.Fatal(err)
			}
			<-pushed
			if string(l.mem) != string(src) {
				for i := range src {
					if l.mem[i] != src[i] {
						t.Fatalf("byte %d of %d is %#x, want %#x (front %d, tail %d)", i, n, l.mem[i], src[i], l.front.Load(), l.tail.Load())
					}
				}
			}
			switch front, tail := l.front.Load(), l.tail.Load(); {
			case tc.receiverFirst && tail != 0:
				t.Fatalf("the sender wrote %d bytes the receiver had copied", tail)
			case tc.senderFirst && (front != 0 || tail != n):
				t.Fatalf("the receiver claimed %d bytes, the sender wrote %d, of %d it wrote alone", front, tail, n)
			}
		})
	}
}

// TestCloseWithGrantToGoneProcess: a connection that holds its peer's grant
// when it closes, and cannot tell the peer (its process is gone), still
// closes, and later writes fail. Closing used to close again
// from inside itself, on the revoke's failed write, and hang for good.
func TestCloseWithGrantToGoneProcess(t *testing.T) {
	agents := startGroup(t, 1, registerBasics)
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	nc, other := net.Pipe()
	defer other.Close()
	c := newConn(agents[0], nc, agents[0].self, true, bufio.NewReader(nc), gone.Process.Pid, true, true, true)
	c.grant.g = &peerGrant{token: 3, addr: 1 << 30, word: 1 << 30, size: pushFrom}
	closed := make(chan struct{})
	go func() {
		c.close(errors.New("test: peer gone"))
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("closing a connection whose peer's grant cannot be revoked did not return in 10 s")
	}
	if err := c.write(net.Buffers{[]byte("x")}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a write after close: %v, want net.ErrClosed", err)
	}
	if c.grant.g != nil || !c.grant.closed {
		t.Fatal("the peer's grant is still held after close")
	}
}

// TestLandingLayout: the words a grant names lie where the sender writes
// and reads them, at fixed offsets from the completion word.
func TestLandingLayout(t *testing.T) {
	var l landing
	base := unsafe.Offsetof(l.word)
	for name, got := range map[string]uintptr{"status": unsafe.Offsetof(l.status), "tail": unsafe.Offsetof(l.tail), "front": unsafe.Offsetof(l.front)} {
		want := map[string]uintptr{"status": statusOffset, "tail": tailOffset, "front": frontOffset}[name]
		if got-base != want {
			t.Errorf("the %s word is %d bytes after the completion word, the sender uses %d", name, got-base, want)
		}
	}
}
