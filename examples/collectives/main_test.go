package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/internal/testkit"
)

// TestDemo runs the tutorial with three goroutine ranks and checks what each
// rank prints.
func TestDemo(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	outs := commtest.LocalRanks(t, ctx, 3, func(pg *comm.ProcessGroup, out io.Writer) error {
		return demo(ctx, pg, out)
	})
	for r, got := range outs {
		for _, want := range []string{
			"all_reduce(sum)  -> [6 60]",
			"broadcast(0)     -> [3 1 4]",
			"all_gather       -> [0 1 4]",
			"all_reduce(max)  -> [1]",
			"mismatch caught",
		} {
			assert.Containsf(t, got, want, "rank %d's output", r)
		}
	}
}
