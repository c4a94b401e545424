package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// Barrier completes on a rank once every member of the group has called it.
// The fingerprint exchange that every collective performs (each member hears
// from every other) is itself the barrier, so Barrier sends nothing else.
func (pg *ProcessGroup) Barrier(ctx context.Context) Work {
	return pg.start(ctx, collective{name: "barrier", desc: "barrier()",
		run: func(ctx context.Context, c *opCtx) error { return nil }})
}

// MonitoredBarrier is a barrier that rank 0 supervises, to find ranks that
// are stuck: every other rank reports to rank 0 and waits for its verdict;
// rank 0 waits up to timeout for the reports. When some rank does not report
// in time, MonitoredBarrier fails on rank 0 (and on every rank that reported)
// with an error wrapping ErrTimeout that lists the ranks that did not arrive.
// With waitAll false rank 0 gives up at the first missing rank it finds; with
// waitAll true it waits out the timeout for all of them. A failed monitored
// barrier does not abort the group. It blocks, bounded by ctx and timeout.
func (pg *ProcessGroup) MonitoredBarrier(ctx context.Context, timeout time.Duration, waitAll bool) error {
	if timeout <= 0 {
		timeout = pg.opts.timeout
	}
	return pg.start(ctx, collective{name: "monitored_barrier", desc: "monitored_barrier()",
		run:       func(ctx context.Context, c *opCtx) error { return monitoredBarrier(ctx, c, timeout, waitAll) },
		unchecked: true}).Wait(ctx)
}

const (
	stepMonitorReport = 1
	verdictSize       = 1024
)

func monitoredBarrier(ctx context.Context, c *opCtx, timeout time.Duration, waitAll bool) error {
	n, r := c.size(), c.rank()
	if n == 1 {
		return nil
	}
	if r != 0 {
		if err := c.send(ctx, 0, stepMonitorReport, []byte{1}); err != nil {
			return err
		}
		// Rank 0 answers within timeout of its own arrival; allow for ranks
		// that arrive up to timeout before it.
		wait := 2*timeout + time.Second
		tctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		verdict := make([]byte, verdictSize)
		if err := c.recv(tctx, 0, stepMonitor, verdict); err != nil {
			if tctx.Err() != nil && ctx.Err() == nil {
				return errs.Wrap(tctx, fmt.Sprintf("comm: monitored barrier: rank 0 gave no verdict within %v (is rank 0 stuck?)", wait), err)
			}
			return err
		}
		if verdict[0] == 0 {
			return nil
		}
		msg := string(verdict[3 : 3+int(binary.LittleEndian.Uint16(verdict[1:3]))])
		return fmt.Errorf("comm: monitored barrier: %s (reported by rank 0): %w", msg, ErrTimeout)
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var missing []int
	type result struct {
		peer int
		err  error
	}
	results := make(chan result, n-1)
	for peer := 1; peer < n; peer++ {
		go func() {
			results <- result{peer, c.recv(tctx, peer, stepMonitorReport, make([]byte, 1))}
		}()
	}
	var hard error
	for range n - 1 {
		res := <-results
		if res.err == nil {
			continue
		}
		missing = append(missing, res.peer)
		if !errors.Is(res.err, ErrTimeout) && !errors.Is(res.err, context.DeadlineExceeded) && !errors.Is(res.err, context.Canceled) && hard == nil {
			hard = res.err
		}
		if !waitAll {
			cancel()
		}
	}
	sort.Ints(missing)
	verdict := make([]byte, verdictSize)
	var failure error
	if len(missing) > 0 {
		names := make([]string, len(missing))
		for i, m := range missing {
			names[i] = fmt.Sprint(m)
		}
		what := "ranks %s did not reach the barrier within %v"
		if !waitAll {
			what = "ranks %s (at least) did not reach the barrier within %v"
		}
		msg := fmt.Sprintf(what, strings.Join(names, ","), timeout)
		if len(msg) > verdictSize-3 {
			msg = msg[:verdictSize-3]
		}
		verdict[0] = 1
		binary.LittleEndian.PutUint16(verdict[1:3], uint16(len(msg)))
		copy(verdict[3:], msg)
		failure = fmt.Errorf("comm: monitored barrier: %s: %w", msg, ErrTimeout)
		if hard != nil {
			failure = fmt.Errorf("comm: monitored barrier: %s: %w: %w", msg, ErrTimeout, hard)
		}
	}
	for peer := 1; peer < n; peer++ {
		// Late ranks find the verdict waiting for them.
		if err := c.send(ctx, peer, stepMonitor, verdict); err != nil && failure == nil {
			failure = err
		}
	}
	return failure
}
