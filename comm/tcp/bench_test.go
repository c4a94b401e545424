package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
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
				xs := make([]*tensor.Dense, world)
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
						for i := 0; i < b.N; i++ {
							if err := pg.AllReduce(ctx, xs[r], comm.Sum).Wait(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

func benchGroups(b *testing.B, n int) []*comm.ProcessGroup {
	st := store.NewMemory()
	b.Cleanup(func() { st.Close() })
	backend := tcp.NewBackend(tcp.WithHost("127.0.0.1"))
	pgs := make([]*comm.ProcessGroup, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, err := backend.Connect(context.Background(), transport.Config{Rank: r, Size: n, Store: st})
			if err == nil {
				pgs[r], err = comm.NewProcessGroup(context.Background(), tr)
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, pg := range pgs {
			go pg.Close()
		}
	})
	return pgs
}
