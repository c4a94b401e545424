package tcp_test

import (
	"fmt"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
)

// BenchmarkAllReduceHalf all-reduces the same number of elements as float32,
// float16 and bfloat16 tensors over loopback TCP. Throughput is in float32
// bytes (elements × 4) for every dtype, so the rates compare the gradients
// moved per second: the 16-bit runs send half the bytes and pay for the
// conversions and float32 folding.
func BenchmarkAllReduceHalf(b *testing.B) {
	for _, world := range []int{2, 4} {
		for _, numel := range []int{1 << 10, 4 << 20, 16 << 20} {
			for _, dt := range []tensor.Dtype{tensor.Float32, comm.Float16Dtype, comm.BFloat16Dtype} {
				b.Run(fmt.Sprintf("world=%d/elems=%d/%v", world, numel, dt), func(b *testing.B) {
					pgs := benchGroups(b, world)
					xs := commtest.Zeros(world, numel, dt)
					b.SetBytes(int64(numel) * 4)
					commtest.BenchAllReduce(b, pgs, xs)
				})
			}
		}
	}
}
