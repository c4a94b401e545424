//go:build tandemcuda

package devstage_test

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// TestCUDAAllReduce stages an all-reduce of device buffers on GPU 0 across
// three goroutine ranks, each with its own CUDA device (context and
// stream), and compares the buffers, read back, with the exact sums. It
// needs a GPU: gorgonia.org/cu initialises the driver when the test binary
// starts and exits if that fails.
func TestCUDAAllReduce(t *testing.T) {
	const size, n, chunk = 3, 100003, 1 << 16
	pgs := localGroups(t, size)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testkit.RequireEachRank(t, size, func(r int) error {
		dev, err := devstage.NewCUDA(0)
		if err != nil {
			return err
		}
		defer dev.Close()
		buf, err := dev.AllocBuffer(tensor.Float32, n)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		host := make([]float32, n)
		for i := range host {
			host[i] = float32(rankValue(r, i))
		}
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 4*n)
		if err := dev.Write(buf, 0, raw); err != nil {
			return err
		}
		s, err := devstage.New(dev, devstage.WithChunkBytes(chunk))
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.AllReduce(ctx, pgs[r], buf, comm.Sum); err != nil {
			return err
		}
		clear(host)
		if err := dev.Read(raw, buf, 0); err != nil {
			return err
		}
		for i := range host {
			var want float64
			for q := 0; q < size; q++ {
				want += rankValue(q, i)
			}
			if float64(host[i]) != want {
				return fmt.Errorf("element %d: got %v, want %v", i, host[i], want)
			}
		}
		return nil
	})
}
