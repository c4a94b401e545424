package ddp

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
)

// BenchmarkCompressHook runs the fp16 and bf16 compression hooks on a float32
// bucket between goroutine ranks over loopback TCP, beside AllReduceHook on
// the same bucket. Throughput is the bucket's float32 bytes.
func BenchmarkCompressHook(b *testing.B) {
	hooks := []struct {
		name string
		run  func(ctx context.Context, pg *comm.ProcessGroup, gb *GradBucket) Future
	}{
		{"allreduce", AllReduceHook},
		{"fp16", func(ctx context.Context, pg *comm.ProcessGroup, gb *GradBucket) Future {
			return compressHook(ctx, pg, gb, float16)
		}},
		{"bf16", func(ctx context.Context, pg *comm.ProcessGroup, gb *GradBucket) Future {
			return compressHook(ctx, pg, gb, bfloat16)
		}},
	}
	for _, world := range []int{2, 4} {
		for _, numel := range []int{1 << 20, 4 << 20} {
			for _, h := range hooks {
				b.Run(fmt.Sprintf("world=%d/elems=%d/%s", world, numel, h.name), func(b *testing.B) {
					pgs := hookBenchGroups(b, world)
					ctx := context.Background()
					b.SetBytes(int64(numel) * 4)
					b.ResetTimer()
					var wg sync.WaitGroup
					for r, pg := range pgs {
						wg.Add(1)
						go func() {
							defer wg.Done()
							gb := &GradBucket{buf: tensor.New(tensor.WithShape(numel), tensor.Of(tensor.Float32))}
							for i := 0; i < b.N; i++ {
								if _, err := h.run(ctx, pg, gb).Wait(ctx); err != nil {
									b.Errorf("rank %d: %v", r, err)
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
}

func hookBenchGroups(b *testing.B, n int) []*comm.ProcessGroup {
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
