package shm_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
)

// pair connects a world of two shm transports with rings of ring bytes.
func pair(t *testing.T, ring int) [2]*shm.Transport {
	t.Helper()
	return pairWith(t, shm.WithRingBytes(ring))
}

// pairWith connects a world of two shm transports built with opts.
func pairWith(t *testing.T, opts ...shm.Option) [2]*shm.Transport {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ts [2]*shm.Transport
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts[r], errs[r] = shm.NewBackend(opts...).ConnectSHM(ctx, transport.Config{Rank: r, Size: 2, Store: st})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { ts[r].Close() })
	}
	return ts
}

func f32s(n int, f func(i int) float32) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f(i)))
	}
	return b
}

func addF32(dst, src []byte) {
	for i := 0; i+4 <= len(dst); i += 4 {
		x := math.Float32frombits(binary.LittleEndian.Uint32(dst[i:])) + math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
		binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(x))
	}
}

// TestRecvReduce: a message larger than the ring is combined into the
// receive's buffer piece by piece, pieces starting at multiples of 64
// bytes; a message that arrived before its receive is combined from the
// buffered copy; lengths that differ fail with ErrMismatch.
func TestRecvReduce(t *testing.T) {
	ts := pair(t, 64<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = (3 << 20) / 4 // 3 MiB of float32: 48 rings' worth
	for _, early := range []bool{false, true} {
		msg := f32s(n, func(i int) float32 { return float32(i % 1000) })
		dst := f32s(n, func(i int) float32 { return 0.5 })
		sent := make(chan error, 1)
		if early {
			small := f32s(16, func(i int) float32 { return float32(i) })
			if err := ts[0].Send(ctx, 1, 9, small); err != nil {
				t.Fatal(err)
			}
			d := f32s(16, func(int) float32 { return 1 })
			if err := ts[1].RecvReduce(ctx, 0, 9, d, addF32); err != nil {
				t.Fatal(err)
			}
			for i := range 16 {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:])); got != float32(i)+1 {
					t.Fatalf("buffered message: element %d: got %v, want %v", i, got, float32(i)+1)
				}
			}
			continue
		}
		go func() { sent <- ts[0].Send(ctx, 1, 7, msg) }()
		var mu sync.Mutex
		pieces := 0
		covered := 0
		err := ts[1].RecvReduce(ctx, 0, 7, dst, func(d, s []byte) {
			mu.Lock()
			defer mu.Unlock()
			if len(d) != len(s) {
				t.Errorf("piece of %d bytes reduced with %d", len(d), len(s))
			}
			if covered%64 != 0 {
				t.Errorf("a piece starts at byte %d, not a multiple of 64", covered)
			}
			pieces++
			covered += len(d)
			addF32(d, s)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		if covered != len(dst) || pieces < 2 {
			t.Errorf("%d pieces covering %d bytes; want several covering %d", pieces, covered, len(dst))
		}
		for i := range n {
			if got, want := math.Float32frombits(binary.LittleEndian.Uint32(dst[4*i:])), float32(i%1000)+0.5; got != want {
				t.Fatalf("element %d: got %v, want %v", i, got, want)
			}
		}
	}
	go ts[0].Send(ctx, 1, 8, make([]byte, 64))
	if err := ts[1].RecvReduce(ctx, 0, 8, make([]byte, 32), addF32); !errors.Is(err, transport.ErrMismatch) {
		t.Errorf("RecvReduce of 32 bytes from a 64-byte message: got %v, want ErrMismatch", err)
	}
}
