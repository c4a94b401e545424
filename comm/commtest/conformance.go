package commtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/testkit"
)

// NewGroups builds the n world groups of one fresh world (index r is rank r),
// each made with opts. It fails t when it cannot.
type NewGroups func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup

// RunConformance runs the whole suite as subtests of t over the backend that
// newGroups builds.
func RunConformance(t *testing.T, newGroups NewGroups) {
	s := &suite{newGroups: newGroups}
	t.Run("AllReduce", s.testAllReduce)
	t.Run("HalfPrecision", s.testHalfPrecision)
	t.Run("AllReduceCoalesced", s.testAllReduceCoalesced)
	t.Run("Broadcast", s.testBroadcast)
	t.Run("Reduce", s.testReduce)
	t.Run("AllGather", s.testAllGather)
	t.Run("GatherScatter", s.testGatherScatter)
	t.Run("ReduceScatter", s.testReduceScatter)
	t.Run("AllToAll", s.testAllToAll)
	t.Run("Barrier", s.testBarrier)
	t.Run("ManyInFlight", s.testManyInFlight)
	t.Run("InvalidArguments", s.testInvalidArguments)
	t.Run("Mismatch", s.testMismatch)
	t.Run("Deadline", s.testDeadline)
	t.Run("ContextRule", s.testContextRule)
	t.Run("Abort", s.testAbort)
	t.Run("Closed", s.testClosed)
	t.Run("PointToPoint", s.testPointToPoint)
	t.Run("Subgroups", s.testSubgroups)
	t.Run("Split", s.testSplit)
	t.Run("Objects", s.testObjects)
	t.Run("MonitoredBarrier", s.testMonitoredBarrier)
}

type suite struct {
	newGroups NewGroups
}

// testTimeout bounds every test's operations, so that a bug fails a test
// instead of hanging the suite.
const testTimeout = 30 * time.Second

// world builds n groups and closes them when the test ends.
func (s *suite) world(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
	t.Helper()
	pgs := s.newGroups(t, n, opts...)
	if len(pgs) != n {
		t.Fatalf("newGroups(%d) returned %d groups", n, len(pgs))
	}
	for r, pg := range pgs {
		if pg.Rank() != r || pg.Size() != n {
			t.Fatalf("group %d reports rank %d of %d; want rank %d of %d", r, pg.Rank(), pg.Size(), r, n)
		}
	}
	t.Cleanup(func() { closeAll(t, pgs) })
	return pgs
}

// closeAll closes every group at once (as processes would at exit).
func closeAll(t *testing.T, pgs []*comm.ProcessGroup) {
	var wg sync.WaitGroup
	for _, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = pg.Close()
		}()
	}
	wg.Wait()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// each runs f for every rank in its own goroutine and returns each rank's
// error.
func each(pgs []*comm.ProcessGroup, f func(r int, pg *comm.ProcessGroup) error) []error {
	return testkit.EachRank(len(pgs), func(r int) error { return f(r, pgs[r]) })
}

// mustEach is each that fails t on any rank's error.
func mustEach(t *testing.T, pgs []*comm.ProcessGroup, f func(r int, pg *comm.ProcessGroup) error) {
	t.Helper()
	testkit.RequireEachRank(t, len(pgs), func(r int) error { return f(r, pgs[r]) })
}
