package shm_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/comm/transport/transporttest"
)

// TestOutOfOrderLarge: large messages received in another order than sent
// arrive intact, and a receive waiting behind an unclaimed large frame
// does not wait for the frame's hold time to run out.
//
// The hold is set to 2 s here, so that a receive that waited it out cannot
// pass for one the scheduler merely delayed (with the default 5 ms, a
// loaded machine under -race made every try look like one).
func TestOutOfOrderLarge(t *testing.T) {
	const hold = 2 * time.Second
	t.Cleanup(shm.SetHoldFor(hold))
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
		if d := time.Since(start); d < hold/2 {
			fast = true // the held frame was buffered as soon as the other receive came
			break
		} else if d > 3*hold {
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
		t.Errorf("in 20 tries, every receive behind an unclaimed large frame waited out the frame's %v hold", hold)
	}
}

// TestTransportContract runs the point-to-point contract with the default
// rings and with rings far smaller than the large messages.
func TestTransportContract(t *testing.T) {
	for _, c := range []struct {
		name string
		b    shm.Backend
	}{{"default", shm.NewBackend()}, {"64KiB-ring", shm.NewBackend(shm.WithRingBytes(64 << 10))}} {
		t.Run(c.name, func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
				return transporttest.Connect(t, c.b, n, nil)
			})
		})
	}
}
