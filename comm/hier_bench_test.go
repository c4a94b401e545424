package comm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
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
				xs := make([]*tensor.Dense, n)
				for r := range xs {
					xs[r] = tensor.New(tensor.WithShape(size/4), tensor.Of(tensor.Float32))
				}
				ctx := context.Background()
				b.SetBytes(int64(size))
				b.ResetTimer()
				var wg sync.WaitGroup
				for r, pg := range pgs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range b.N {
							if err := pg.AllReduce(ctx, xs[r], comm.Sum).Wait(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				per := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(size)*2*(n-1)/n/per/1e9, "busGB/s")
			})
		}
	}
}

func benchHosts(b *testing.B, n int, layout string) []*comm.ProcessGroup {
	st := store.NewMemory()
	b.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs := make([]*comm.ProcessGroup, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []comm.InitOption{comm.WithStore(st), comm.WithRank(r), comm.WithWorldSize(n), comm.WithoutDefault()}
			switch layout {
			case "tcp":
				opts = append(opts, comm.WithBackend("tcp"))
			case "shm":
				opts = append(opts, comm.WithBackend(comm.AutoBackend))
			default:
				opts = append(opts, comm.WithBackend(comm.AutoBackend), comm.WithHostID(fmt.Sprint("host", r/2)))
			}
			pgs[r], errs[r] = comm.Init(ctx, "env://", opts...)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			wg.Add(1)
			go func() { defer wg.Done(); pg.Close() }()
		}
		wg.Wait()
	})
	return pgs
}
