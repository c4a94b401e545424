package ddp

import (
	"context"
	"fmt"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/internal/testkit"
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
					testkit.RequireEachRank(b, world, func(r int) error {
						gb := &GradBucket{buf: tensor.New(tensor.WithShape(numel), tensor.Of(tensor.Float32))}
						for range b.N {
							if _, err := h.run(ctx, pgs[r], gb).Wait(ctx); err != nil {
								return err
							}
						}
						return nil
					})
				})
			}
		}
	}
}

func hookBenchGroups(b *testing.B, n int) []*comm.ProcessGroup {
	return commtest.Groups(b, tcp.NewBackend(tcp.WithHost("127.0.0.1")), n)
}
