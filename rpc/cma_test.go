package rpc

import (
	"context"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/samehost"
)

func registerSum(rank int, reg *Registry) {
	registerBasics(rank, reg)
	must(Register(reg, "sum", func(ctx context.Context, x *tensor.Dense) (float64, error) {
		var s float64
		for _, v := range x.Data().([]float32) {
			s += float64(v)
		}
		return s, nil
	}))
}

func TestSameHostCopy(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			agents := startGroup(t, 2, registerSum, WithSameHostCopy(on))
			ctx := context.Background()
			n := cmaThreshold/4 + 1 // just over the threshold
			data := make([]float32, n)
			for i := range data {
				data[i] = float32(i % 1000)
			}
			x := dense([]int{n}, data)
			y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
			if err != nil {
				t.Fatal(err)
			}
			if !sameTensor(x, y) {
				t.Fatal("echo changed the tensor")
			}
			c := agents[0].peers[1].cur.Load()
			if want := on && samehost.Supported && samehost.BootID() != ([16]byte{}); c.sendByRef != want || c.recvByRef != want {
				t.Fatalf("same-host copies on the connection: send %v recv %v, want %v", c.sendByRef, c.recvByRef, want)
			}
			copies := func() int64 { return agents[0].Metrics().SameHostCopies + agents[1].Metrics().SameHostCopies }
			if on {
				// The reply's sender counts its copy once the acknowledgement is in.
				deadline := time.Now().Add(5 * time.Second)
				for copies() < 2 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			if n := copies(); (n >= 2) != on {
				t.Fatalf("%d same-host copies with them %v", n, map[bool]string{true: "on", false: "off"}[on])
			}
			// The caller may change the tensor as soon as Async returns.
			var want float64
			for _, v := range data {
				want += float64(v)
			}
			f := Async[float64](ctx, agents[0], "w1", "sum", x)
			for i := range data {
				data[i] = -1
			}
			if got, err := f.Wait(ctx); err != nil || got != want {
				t.Fatalf("sum: %v %v, want %v", got, err, want)
			}
			// Many large calls at once.
			var futs []*Future[*tensor.Dense]
			for i := 0; i < 8; i++ {
				futs = append(futs, Async[*tensor.Dense](ctx, agents[1], "w0", "echo", x))
			}
			for _, f := range futs {
				if y, err := f.Wait(ctx); err != nil || !sameTensor(x, y) {
					t.Fatalf("concurrent echo: %v", err)
				}
			}
		})
	}
}

// TestSameHostCopyFromReadLoop covers sends that start on a connection's
// read loop: an async function whose future is already complete (its reply
// is sent while the read loop dispatches), and a call made in a Then
// callback. Neither may wait for an acknowledgement only that loop could
// read.
func TestSameHostCopyFromReadLoop(t *testing.T) {
	n := cmaThreshold/4 + 1
	big := dense([]int{n}, make([]float32, n))
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		registerBasics(rank, reg)
		must(RegisterAsync(reg, "bigNow", func(ctx context.Context, _ struct{}) *Future[*tensor.Dense] {
			return Ready(big, nil)
		}))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "bigNow", struct{}{})
	if err != nil || !sameTensor(y, big) {
		t.Fatalf("async function replying at once: %v", err)
	}
	done := make(chan error, 1)
	Async[int](ctx, agents[0], "w1", "add", [2]int{1, 2}).Then(func(int, error) {
		// On the read loop of the connection to w1: a big call to w1.
		Async[*tensor.Dense](ctx, agents[0], "w1", "echo", big).Then(func(_ *tensor.Dense, err error) { done <- err })
	})
	if err := <-done; err != nil {
		t.Fatalf("big call from a callback: %v", err)
	}
}

// TestSameHostCopySyncNeedsNoAck: a Sync call's tensors go by reference
// without a read-done frame (its reply says the callee has copied them),
// while an Async call waits for one before it returns.
func TestSameHostCopySyncNeedsNoAck(t *testing.T) {
	if !samehost.Supported || samehost.BootID() == ([16]byte{}) {
		t.Skip("same-host copies are not available here")
	}
	agents := startGroup(t, 2, registerSum)
	ctx := context.Background()
	n := cmaThreshold / 4
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(i % 7)
	}
	x := dense([]int{n}, data)
	var want float64
	for _, v := range data {
		want += float64(v)
	}
	before := agents[0].Metrics().SameHostCopies
	for i := 0; i < 3; i++ {
		if got, err := Sync[float64](ctx, agents[0], "w1", "sum", x); err != nil || got != want {
			t.Fatalf("sum: %v %v, want %v", got, err, want)
		}
	}
	c := agents[0].peers[1].cur.Load()
	if got := c.acksSeen.Load(); got != 0 {
		t.Fatalf("%d read-done frames for Sync calls, want none", got)
	}
	// The first call goes by reference; the others may go inline when they
	// start while the read loop still finishes the last reply.
	if got := agents[0].Metrics().SameHostCopies - before; got < 1 || got > 3 {
		t.Fatalf("%d same-host copies counted for 3 Sync calls", got)
	}
	// An Async call made while the read loop still finishes the last reply
	// goes inline; the next ones go by reference and are acknowledged.
	for i := 0; i < 50 && c.acksSeen.Load() == 0; i++ {
		if got, err := Async[float64](ctx, agents[0], "w1", "sum", x).Wait(ctx); err != nil || got != want {
			t.Fatalf("async sum: %v %v, want %v", got, err, want)
		}
	}
	if c.acksSeen.Load() == 0 {
		t.Fatal("no read-done frame after 50 Async calls by reference")
	}
}
