package ddp_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/launch"
)

// The flight recorder's share of a DDP step: two ranks train an MLP whose
// step takes milliseconds, with the recorder off, at its default and at
// DETAIL. collectives/step says how many records a step writes; each costs
// about 0.2 µs (comm's BenchmarkFlightRecordOp).
func BenchmarkStepFlightRecorder(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []comm.Option
	}{
		{"off", []comm.Option{comm.WithFlightRecorder(0)}},
		{"default", nil},
		{"detail", []comm.Option{comm.WithDebugLevel(launch.DebugDetail), comm.WithLogger(slog.New(slog.DiscardHandler))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			opts := append([]comm.Option{comm.WithTimeout(time.Minute), comm.WithFlightDir(b.TempDir())}, c.opts...)
			pgs, err := local.NewGroups(context.Background(), 2, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll(pgs)
			ctx := context.Background()
			nets := make([]*ddp.DDP, 2)
			for r, err := range testkit.EachRank(2, func(r int) error {
				var err error
				nets[r], err = ddp.New(ctx, pgs[r], newMLP(b, []int{128, 256, 256, 10}, 1), ddp.BucketCapMB(0.25))
				return err
			}) {
				if err != nil {
					b.Fatalf("rank %d: %v", r, err)
				}
			}
			x, y := batch(1, 32, 128, 10)
			step := func(n int) {
				for r, err := range testkit.EachRank(2, func(r int) error {
					for range n {
						if _, err := nets[r].Step(ctx, x, y); err != nil {
							return err
						}
					}
					return nil
				}) {
					if err != nil {
						b.Fatalf("rank %d: %v", r, err)
					}
				}
			}
			step(3) // build, compile, rebuild the buckets
			before := pgs[0].FlightRecord().Groups[0].NextSeq
			b.ResetTimer()
			step(b.N)
			b.StopTimer()
			after := pgs[0].FlightRecord().Groups[0].NextSeq
			b.ReportMetric(float64(after-before)/float64(b.N), "collectives/step")
		})
	}
}
