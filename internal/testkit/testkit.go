// Package testkit holds the test helpers that every package's tests share:
// the goroutine-leak check and the run-on-every-rank helper. It imports
// nothing of Tandem, so any package's internal tests may use it.
package testkit

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LeakOption adjusts a leak check.
type LeakOption func(*leakConfig)

type leakConfig struct {
	slack  int
	within time.Duration
}

// Slack lets n goroutines more than the baseline remain: ones that the
// runtime or a shared resource (a proxy, a store) starts and ends on its own
// schedule.
func Slack(n int) LeakOption { return func(c *leakConfig) { c.slack = n } }

// Within sets how long the goroutines have to wind down (10 s by default).
// The check returns as soon as they have, so a long grace costs nothing when
// nothing leaks.
func Within(d time.Duration) LeakOption { return func(c *leakConfig) { c.within = d } }

// RequireNoLeak waits until the number of goroutines is back to at most
// before (a runtime.NumGoroutine taken at the start of the test), and
// otherwise fails the test at once with every goroutine's stack.
func RequireNoLeak(t testing.TB, before int, opts ...LeakOption) {
	t.Helper()
	if n, stacks := settle(before, opts); stacks != "" {
		require.FailNowf(t, "goroutines leaked", "%d goroutines before, %d after:\n%s", before, n, stacks)
	}
}

// AssertNoLeak is RequireNoLeak that marks the test failed and goes on.
func AssertNoLeak(t testing.TB, before int, opts ...LeakOption) bool {
	t.Helper()
	if n, stacks := settle(before, opts); stacks != "" {
		return assert.Failf(t, "goroutines leaked", "%d goroutines before, %d after:\n%s", before, n, stacks)
	}
	return true
}

// CheckLeaks takes the goroutine count now and checks, when the test and
// every cleanup registered after this call have finished, that no goroutine
// started since is still running. Call it first in a test, before the
// resources whose cleanups must run ahead of the check.
func CheckLeaks(t testing.TB, opts ...LeakOption) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() { AssertNoLeak(t, before, opts...) })
}

// settle waits for the count to come down to before plus the slack and
// returns the count and, when it did not in time, every goroutine's stack.
func settle(before int, opts []LeakOption) (int, string) {
	cfg := leakConfig{within: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	deadline := time.Now().Add(cfg.within)
	for {
		n := runtime.NumGoroutine()
		if n <= before+cfg.slack {
			return n, ""
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			return n, string(buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// EachRank runs fn for every rank in [0, n) on its own goroutine and returns
// the errors, indexed by rank. A rank that panics returns an error carrying
// the panic and its stack instead of taking the test binary down.
func EachRank(n int, fn func(rank int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					errs[r] = fmt.Errorf("rank %d panicked: %v\n%s", r, p, debug.Stack())
				}
			}()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

// RequireEachRank is EachRank that reports every rank's error and then
// stops the test if any rank failed.
func RequireEachRank(t testing.TB, n int, fn func(rank int) error) {
	t.Helper()
	failed := false
	for r, err := range EachRank(n, fn) {
		if !assert.NoErrorf(t, err, "rank %d", r) {
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
}

// Context returns a context that ends after d or when the test ends,
// whichever comes first.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ReadEnvFile reads an environment recorded in a file: NAME=VALUE lines,
// blank lines and # comments passed over. It fails t on a line of any other
// form.
func ReadEnvFile(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	vars := map[string]string{}
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.Truef(t, ok, "%s:%d: %q is not NAME=VALUE", path, n+1, line)
		vars[k] = v
	}
	return vars
}
