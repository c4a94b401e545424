package comm_test

import (
	"fmt"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"gorgonia.org/tensor"
)

// BenchmarkHostsAllReduce all-reduces float32 buffers among four goroutine
// ranks that Init connects three ways: all over TCP, all on one host
// (shared memory), and as two hosts of two ranks (shared memory inside a
// host, TCP between them, the hierarchical all-reduce). busGB/s counts
// bytes*2(n-1)/n per all-reduce.
func BenchmarkHostsAllReduce(b *testing.B) {
	const n = 4
	for _, size := range []int{16 << 20, 64 << 20} {
		for _, layout := range []string{"tcp", "shm", "2x2"} {
			b.Run(fmt.Sprintf("bytes=%d/%s", size, layout), func(b *testing.B) {
				pgs := benchHosts(b, n, layout)
				xs := commtest.Zeros(n, size/4, tensor.Float32)
				b.SetBytes(int64(size))
				commtest.BenchAllReduce(b, pgs, xs)
				b.StopTimer()
				per := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(size)*2*(n-1)/n/per/1e9, "busGB/s")
			})
		}
	}
}

func benchHosts(b *testing.B, n int, layout string) []*comm.ProcessGroup {
	return commtest.InitGroups(b, n, func(r int) []comm.InitOption {
		switch layout {
		case "tcp":
			return []comm.InitOption{comm.WithBackend("tcp")}
		case "shm":
			return []comm.InitOption{comm.WithBackend(comm.AutoBackend)}
		}
		return []comm.InitOption{comm.WithBackend(comm.AutoBackend), comm.WithHostID(fmt.Sprint("host", r/2))}
	})
}
