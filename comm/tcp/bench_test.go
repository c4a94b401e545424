package tcp_test

import (
	"fmt"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/tcp"
	"gorgonia.org/tensor"
)

// BenchmarkAllReduce all-reduces float32 buffers between goroutine ranks,
// each with its own TCP transport on loopback. (`tandem bench allreduce`
// measures the same with one process per rank.)
func BenchmarkAllReduce(b *testing.B) {
	for _, world := range []int{2, 4} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("world=%d/bytes=%d", world, size), func(b *testing.B) {
				pgs := benchGroups(b, world)
				xs := commtest.Zeros(world, size/4, tensor.Float32)
				b.SetBytes(int64(size))
				commtest.BenchAllReduce(b, pgs, xs)
			})
		}
	}
}

// benchGroups connects n goroutine ranks over loopback TCP.
func benchGroups(b *testing.B, n int) []*comm.ProcessGroup {
	return commtest.Groups(b, tcp.NewBackend(tcp.WithHost("127.0.0.1")), n)
}
