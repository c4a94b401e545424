package commtest

import (
	"context"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/testkit"
)

// Zeros returns one zeroed tensor of numel elements of dtype dt per rank
// of a world of n, for benchmarks.
func Zeros(n, numel int, dt tensor.Dtype) []*tensor.Dense {
	xs := make([]*tensor.Dense, n)
	for r := range xs {
		xs[r] = tensor.New(tensor.WithShape(numel), tensor.Of(dt))
	}
	return xs
}

// BenchAllReduce is the timed loop of an all-reduce benchmark: it resets
// the timer, then every rank r of pgs sum-all-reduces xs[r] b.N times, all
// ranks at once, each on its own goroutine. Set the bytes per operation
// (b.SetBytes) before.
func BenchAllReduce(b *testing.B, pgs []*comm.ProcessGroup, xs []*tensor.Dense) {
	ctx := context.Background()
	b.ResetTimer()
	testkit.RequireEachRank(b, len(pgs), func(r int) error {
		for range b.N {
			if err := pgs[r].AllReduce(ctx, xs[r], comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}
