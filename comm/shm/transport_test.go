package shm_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// TestOutOfOrderLarge: large messages received in another order than sent
// arrive intact, and a receive waiting behind an unclaimed large frame
// does not wait for the frame's hold time to run out.
func TestOutOfOrderLarge(t *testing.T) {
	ts := pair(t, 64<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := bytes.Repeat([]byte{1}, 256<<10), bytes.Repeat([]byte{2}, 300<<10)
	sent := make(chan error, 1)
	go func() {
		if err := ts[0].Send(ctx, 1, 10, a); err != nil {
			sent <- err
			return
		}
		sent <- ts[0].Send(ctx, 1, 11, b)
	}()
	gotB, gotA := make([]byte, len(b)), make([]byte, len(a))
	fast := false
	for range 20 {
		start := time.Now()
		if err := ts[1].Recv(ctx, 0, 11, gotB); err != nil {
			t.Fatal(err)
		}
		if err := ts[1].Recv(ctx, 0, 10, gotA); err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotA, a) || !bytes.Equal(gotB, b) {
			t.Fatal("messages received out of order were corrupted")
		}
		if d := time.Since(start); d < 4*time.Millisecond {
			fast = true // the held frame was buffered as soon as the other receive came
			break
		} else if d > time.Second {
			t.Fatalf("out-of-order receives took %v", d)
		}
		go func() {
			if err := ts[0].Send(ctx, 1, 10, a); err != nil {
				sent <- err
				return
			}
			sent <- ts[0].Send(ctx, 1, 11, b)
		}()
	}
	if !fast {
		t.Error("in 20 tries, every receive behind an unclaimed large frame waited out the frame's 5ms hold")
	}
}

// TestCrossingSends: two ranks that each send the other a message much
// larger than the ring before receiving both complete: the transport
// buffers what arrives before its receive.
func TestCrossingSends(t *testing.T) {
	ts := pair(t, 64<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := bytes.Repeat([]byte{byte(r + 1)}, 4<<20)
			if err := ts[r].Send(ctx, 1-r, 3, msg); err != nil {
				errs[r] = err
				return
			}
			got := make([]byte, len(msg))
			if errs[r] = ts[r].Recv(ctx, 1-r, 3, got); errs[r] == nil && !bytes.Equal(got, bytes.Repeat([]byte{byte(2 - r)}, 4<<20)) {
				t.Errorf("rank %d received a corrupted message", r)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
