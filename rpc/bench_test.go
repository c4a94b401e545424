package rpc

import (
	"context"
	"fmt"
	"testing"

	"gorgonia.org/tensor"
)

func BenchmarkSyncEcho(b *testing.B) {
	agents := startGroup(b, 2, registerBasics)
	ctx := context.Background()
	for _, n := range []int{1, 1 << 10, 1 << 20, 4 << 20} {
		x := tensor.New(tensor.WithShape(n), tensor.WithBacking(make([]float32, n)))
		b.Run(fmt.Sprintf("bytes=%d", 4*n), func(b *testing.B) {
			b.SetBytes(int64(8 * n))
			for i := 0; i < b.N; i++ {
				if _, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAsync64(b *testing.B) {
	agents := startGroup(b, 2, registerBasics)
	ctx := context.Background()
	x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{1}))
	sem := make(chan struct{}, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sem <- struct{}{}
		Async[*tensor.Dense](ctx, agents[0], "w1", "echo", x).Then(func(*tensor.Dense, error) { <-sem })
	}
	for i := 0; i < cap(sem); i++ {
		sem <- struct{}{}
	}
}
