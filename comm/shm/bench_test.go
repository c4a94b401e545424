package shm_test

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"gorgonia.org/tensor"
)

// BenchmarkAllReduceProcess all-reduces float32 buffers between ranks that
// are processes (rank 0 this one, the others re-executions of the test
// binary), over shm and, in the same run and interleaved with it, over tcp
// (loopback, with its single-copy path) and over comm's automatic backend
// (Init's default, which should find one host and match shm). busGB/s is the bus bandwidth,
// bytes*2(n-1)/n per all-reduce, as nccl-tests and gloo's benchmark count it.
func BenchmarkAllReduceProcess(b *testing.B) {
	for _, world := range []int{2, 4} {
		for _, size := range []int{4 << 10, 16 << 20, 64 << 20} {
			for _, backend := range []string{"shm", "tcp", "auto"} {
				b.Run(fmt.Sprintf("world=%d/bytes=%d/%s", world, size, backend), func(b *testing.B) {
					benchAllReduce(b, backend, world, size)
				})
			}
		}
	}
}

func benchAllReduce(b *testing.B, backend string, world, size int) {
	tr, _, _ := startRanks(b, backend, "allreduce", world, envSize+"="+strconv.Itoa(size))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg, err := comm.NewProcessGroup(ctx, tr)
	if err != nil {
		b.Fatal(err)
	}
	x := tensor.New(tensor.WithShape(size/4), tensor.Of(tensor.Float32))
	n := tensor.New(tensor.WithShape(1), tensor.WithBacking([]int64{int64(b.N)}))
	bg := context.Background()
	if err := pg.Broadcast(bg, n, 0).Wait(bg); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		if err := pg.AllReduce(bg, x, comm.Sum).Wait(bg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// CPU time of rank 0's process per all-reduce: what the work costs,
	// whatever else competes for the machine's cores.
	b.ReportMetric((cpuTime()-cpu0).Seconds()*1e3/float64(b.N), "cpu-ms/op")
	per := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(size)*2*float64(world-1)/float64(world)/per/1e9, "busGB/s")
	b.ReportMetric(per*1e3, "ms/op")
	n.Data().([]int64)[0] = 0
	if err := pg.Broadcast(bg, n, 0).Wait(bg); err != nil {
		b.Fatal(err)
	}
	pg.Close()
}

// BenchmarkPingPongProcess measures the round trip of a 4 KiB message
// between two processes, over shm and over tcp: the transport's latency
// floor under every small collective.
func BenchmarkPingPongProcess(b *testing.B) {
	const size = 4096
	for _, backend := range []string{"shm", "tcp"} {
		b.Run(backend, func(b *testing.B) {
			tr, _, _ := startRanks(b, backend, "echo", 2, envSize+"="+strconv.Itoa(size))
			buf := make([]byte, size)
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if err := tr.Send(ctx, 1, 1, buf); err != nil {
					b.Fatal(err)
				}
				if err := tr.Recv(ctx, 1, 2, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cpuTime returns the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
