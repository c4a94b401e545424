package commtest

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/internal/testkit"
)

// LocalRanks runs fn on every rank of a world of n goroutine ranks
// (comm/local) at once, each with its own world group and its own output,
// and closes a rank's group when its fn returns. It fails t with every
// failing rank's error and what that rank wrote, and otherwise returns what
// each rank wrote, indexed by rank.
func LocalRanks(t testing.TB, ctx context.Context, n int, fn func(pg *comm.ProcessGroup, out io.Writer) error) []string {
	t.Helper()
	pgs, err := local.NewGroups(ctx, n)
	require.NoErrorf(t, err, "local groups of %d", n)
	bufs := make([]bytes.Buffer, n)
	errs := testkit.EachRank(n, func(r int) error {
		defer pgs[r].Close()
		return fn(pgs[r], &bufs[r])
	})
	outs := make([]string, n)
	failed := false
	for r := range outs {
		outs[r] = bufs[r].String()
		if !assert.NoErrorf(t, errs[r], "rank %d; its output:\n%s", r, outs[r]) {
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	return outs
}
