package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tandemml/tandem/internal/testkit"
)

// recorder is a testing.TB that records failures instead of failing the
// test that checks the helpers.
type recorder struct {
	testing.TB
	failed, stopped bool
	msgs            []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fail()        { r.failed = true }
func (r *recorder) FailNow()     { r.failed, r.stopped = true, true; runtime.Goexit() }
func (r *recorder) Failed() bool { return r.failed }

// run calls fn with a recorder on its own goroutine, as the testing package
// runs a test, so that FailNow can end it. That goroutine is one more than
// the caller's count: see baseline.
func run(t *testing.T, fn func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

// baseline is the goroutine count that a check made inside run sees when
// nothing else is left: the caller's count and run's goroutine. It first
// waits for the count to stop falling, so that a goroutine still winding
// down from the test before (the testing package's own, once its test
// returned) is not counted: one that ended after the count was taken
// would make room for the goroutine a test leaks on purpose.
func baseline() int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			break
		}
		n = m
	}
	return n + 1
}

func TestLeakCheckPassesWhenGoroutinesEnd(t *testing.T) {
	before := baseline()
	stop := make(chan struct{})
	go func() { <-stop }()
	time.AfterFunc(50*time.Millisecond, func() { close(stop) })
	r := run(t, func(tb testing.TB) { testkit.RequireNoLeak(tb, before, testkit.Within(5*time.Second)) })
	assert.False(t, r.failed, "a goroutine that ends within the grace period is no leak")
}

func TestLeakCheckFailsWithStacks(t *testing.T) {
	before := baseline()
	stop := make(chan struct{})
	defer close(stop)
	go func() { <-stop }()
	r := run(t, func(tb testing.TB) { testkit.RequireNoLeak(tb, before, testkit.Within(100*time.Millisecond)) })
	require.True(t, r.stopped, "RequireNoLeak must stop the test")
	assert.False(t, run(t, func(tb testing.TB) {
		testkit.AssertNoLeak(tb, before, testkit.Slack(1), testkit.Within(100*time.Millisecond))
	}).failed, "one goroutine within a slack of one is allowed")
	a := run(t, func(tb testing.TB) { testkit.AssertNoLeak(tb, before, testkit.Within(100*time.Millisecond)) })
	assert.True(t, a.failed)
	assert.False(t, a.stopped, "AssertNoLeak must let the test go on")
	require.NotEmpty(t, a.msgs)
	assert.True(t, strings.Contains(strings.Join(a.msgs, "\n"), "TestLeakCheckFailsWithStacks"), "the report shows the leaked goroutine's stack")
}

func TestEachRank(t *testing.T) {
	var ran atomic.Int32
	boom := errors.New("boom")
	errs := testkit.EachRank(4, func(r int) error {
		ran.Add(1)
		switch r {
		case 1:
			return boom
		case 2:
			panic("rank two")
		}
		return nil
	})
	require.Len(t, errs, 4)
	assert.EqualValues(t, 4, ran.Load())
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], boom)
	assert.ErrorContains(t, errs[2], "rank 2 panicked: rank two")
	assert.NoError(t, errs[3])

	r := run(t, func(tb testing.TB) { testkit.RequireEachRank(tb, 3, func(r int) error { return errs[r] }) })
	assert.True(t, r.stopped, "RequireEachRank stops the test when a rank fails")
	assert.Len(t, r.msgs, 2, "both failing ranks are reported")
	assert.False(t, run(t, func(tb testing.TB) { testkit.RequireEachRank(tb, 3, func(int) error { return nil }) }).failed)
}

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank0.env")
	require.NoError(t, os.WriteFile(path, []byte("# srun -n 3\nRANK=0\r\n\nMASTER_ADDR=a=b\n"), 0o644))
	assert.Equal(t, map[string]string{"RANK": "0", "MASTER_ADDR": "a=b"}, testkit.ReadEnvFile(t, path))

	require.NoError(t, os.WriteFile(path, []byte("RANK=0\nnot a pair\n"), 0o644))
	r := run(t, func(tb testing.TB) { testkit.ReadEnvFile(tb, path) })
	assert.True(t, r.stopped, "a line that is not NAME=VALUE stops the test")
	assert.Contains(t, strings.Join(r.msgs, "\n"), "rank0.env:2")
}

func TestContextEndsWithTheTest(t *testing.T) {
	var ctx context.Context
	t.Run("inner", func(t *testing.T) {
		ctx = testkit.Context(t, time.Minute)
		require.NoError(t, ctx.Err())
		_, ok := ctx.Deadline()
		assert.True(t, ok)
	})
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
}
