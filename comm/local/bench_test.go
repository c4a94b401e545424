package local_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"gorgonia.org/tensor"
)

// benchCollective runs op on every rank b.N times; bytes is the tensor size.
func benchCollective(b *testing.B, n, bytes int, op func(ctx context.Context, pg *comm.ProcessGroup, x *tensor.Dense) error) {
	ctx := context.Background()
	pgs, err := local.NewGroups(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			_ = pg.Close()
		}
	}()
	xs := make([]*tensor.Dense, n)
	for r := range xs {
		xs[r] = tensor.New(tensor.WithShape(bytes/4), tensor.WithBacking(make([]float32, bytes/4)))
	}
	b.SetBytes(int64(bytes))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range b.N {
				if err := op(ctx, pg, xs[r]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

var benchSizes = []int{1 << 10, 64 << 10, 1 << 20, 16 << 20}

func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("n=%d/%dKiB", n, size>>10), func(b *testing.B) {
				benchCollective(b, n, size, func(ctx context.Context, pg *comm.ProcessGroup, x *tensor.Dense) error {
					return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
				})
			})
		}
	}
}

func BenchmarkBroadcast(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("n=4/%dKiB", size>>10), func(b *testing.B) {
			benchCollective(b, 4, size, func(ctx context.Context, pg *comm.ProcessGroup, x *tensor.Dense) error {
				return pg.Broadcast(ctx, x, 0).Wait(ctx)
			})
		})
	}
}
