package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/launch"
)

// tcpURL is the tcp:// init URL of a store on 127.0.0.1:port.
func tcpURL(port, rank, world int) string {
	return fmt.Sprintf("tcp://127.0.0.1:%d?rank=%d&world_size=%d", port, rank, world)
}

func mentions(t *testing.T, who string, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not mention %q", who, err, p)
		}
	}
}

func TestRendezvousDuplicateRank(t *testing.T) {
	port := freePort(t)
	ctx := context.Background()
	// Rank 0 serves the store; the first rank 1 claims its rank.
	first := make(chan error, 1)
	var pgs []*ProcessGroup
	var mu sync.Mutex
	keep := func(pg *ProcessGroup) {
		if pg != nil {
			mu.Lock()
			pgs = append(pgs, pg)
			mu.Unlock()
		}
	}
	defer func() { closeAll(pgs) }()
	// Rank 0 alone first, so the store exists; it waits for rank 1.
	zero := make(chan error, 1)
	go func() {
		pg, err := Init(ctx, tcpURL(port, 0, 2), noEnv(), WithoutDefault(), WithInitTimeout(20*time.Second))
		keep(pg)
		zero <- err
	}()
	go func() {
		pg, err := Init(ctx, tcpURL(port, 1, 2), noEnv(), WithoutDefault(), WithInitTimeout(20*time.Second))
		keep(pg)
		first <- err
	}()
	if err := <-zero; err != nil {
		t.Fatalf("rank 0: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first rank 1: %v", err)
	}
	// A second process claiming rank 1 is refused at once, naming the first.
	_, err := Init(ctx, tcpURL(port, 1, 2), noEnv(), WithoutDefault(), WithInitTimeout(20*time.Second))
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("second rank 1: want ErrMismatch, got %v", err)
	}
	mentions(t, "second rank 1", err, "rank 1 is already taken", "pid", "two processes")
}

func TestRendezvousDuplicateRankFailsEveryoneFast(t *testing.T) {
	// World of 3 where two processes claim rank 1 and nobody claims rank 2:
	// the duplicate says why, and rank 0 and the first rank 1 stop waiting
	// for rank 2 because of it instead of timing out.
	port := freePort(t)
	ctx := context.Background()
	start := time.Now()
	pgs, errs := initAll(3, func(i int) (*ProcessGroup, error) {
		rank := min(i, 1)
		if i == 2 {
			time.Sleep(200 * time.Millisecond) // the duplicate comes second
		}
		return Init(ctx, tcpURL(port, rank, 3), noEnv(), WithoutDefault(), WithInitTimeout(30*time.Second))
	})
	defer closeAll(pgs)
	if !errors.Is(errs[2], ErrMismatch) {
		t.Fatalf("duplicate: want ErrMismatch, got %v", errs[2])
	}
	mentions(t, "duplicate", errs[2], "already taken")
	for i := 0; i < 2; i++ {
		if !errors.Is(errs[i], ErrMismatch) {
			t.Errorf("process %d: want ErrMismatch relayed from the duplicate, got %v", i, errs[i])
			continue
		}
		mentions(t, fmt.Sprint("process ", i), errs[i], "misconfigured", "already taken")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v: the failure was not relayed", d)
	}
}

func TestRendezvousWorldSizeDisagreement(t *testing.T) {
	port := freePort(t)
	pgs, errs := initAll(2, func(r int) (*ProcessGroup, error) {
		world := 2
		if r == 1 {
			world = 3
		}
		return Init(context.Background(), tcpURL(port, r, world), noEnv(), WithoutDefault(), WithInitTimeout(20*time.Second))
	})
	defer closeAll(pgs)
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: want ErrMismatch, got %v", r, err)
			continue
		}
		mentions(t, fmt.Sprint("rank ", r), err, "world size 2", "world size 3")
	}
}

func TestRendezvousNamesMissingRanks(t *testing.T) {
	port := freePort(t)
	// World of 4; ranks 1 and 3 never start.
	present := []int{0, 2}
	pgs, errs := initAll(len(present), func(i int) (*ProcessGroup, error) {
		return Init(context.Background(), tcpURL(port, present[i], 4), noEnv(), WithoutDefault(), WithInitTimeout(time.Second))
	})
	defer closeAll(pgs)
	for i, err := range errs {
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("rank %d: want ErrTimeout wrapping DeadlineExceeded, got %v", present[i], err)
			continue
		}
		mentions(t, fmt.Sprint("rank ", present[i]), err, "ranks [1 3] never arrived", "WORLD_SIZE")
	}
}

func TestRendezvousRankZeroMissing(t *testing.T) {
	port := freePort(t)
	// Rank 1 starts alone: no store is served at the port.
	_, err := Init(context.Background(), tcpURL(port, 1, 2), noEnv(), WithoutDefault(), WithInitTimeout(time.Second))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	mentions(t, "rank 1", err, "rank 0")
}

// storeOpCounter is a store.Observer counting operations by name.
type storeOpCounter struct {
	mu  sync.Mutex
	ops map[string]int
}

func (c *storeOpCounter) StoreOp(op string, _ time.Duration, _ error) {
	c.mu.Lock()
	if c.ops == nil {
		c.ops = map[string]int{}
	}
	c.ops[op]++
	c.mu.Unlock()
}

// At INFO every rank logs the rendezvous once its group exists: the world
// size, every rank's host and process, and how long it took; at OFF
// nothing. The store Init opens takes the options WithStoreOptions gives.
func TestRendezvousLoggedAtInfo(t *testing.T) {
	for _, level := range []launch.DebugLevel{launch.DebugOff, launch.DebugInfo} {
		t.Run(level.String(), func(t *testing.T) {
			port := freePort(t)
			var logs testlog.Buffer
			obs := make([]*storeOpCounter, 2)
			pgs := make([]*ProcessGroup, 2)
			errc := make(chan error, 2)
			for r := range 2 {
				obs[r] = &storeOpCounter{}
				go func() {
					var err error
					pgs[r], err = Init(context.Background(), tcpURL(port, r, 2), noEnv(), WithoutDefault(), WithInitTimeout(20*time.Second),
						WithStoreOptions(store.WithObserver(obs[r])),
						WithGroupOptions(WithLogger(logs.Logger()), WithDebugLevel(level), WithFlightDir(t.TempDir())))
					errc <- err
				}()
			}
			for range 2 {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			closeAll(pgs)
			var lines []string
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, `msg="comm: rendezvous done"`) {
					lines = append(lines, l)
				}
			}
			if level == launch.DebugOff {
				if len(lines) != 0 {
					t.Fatalf("at OFF: %q", lines)
				}
			} else {
				if len(lines) != 2 {
					t.Fatalf("%d rendezvous lines, want one per rank:\n%s", len(lines), logs.String())
				}
				pid := fmt.Sprintf("pid %d", os.Getpid())
				for _, l := range lines {
					for _, want := range []string{"world_size=2", "took=", "0: host ", "1: host ", pid, "127.0.0.1:" + strconv.Itoa(port)} {
						if !strings.Contains(l, want) {
							t.Errorf("no %q in %s", want, l)
						}
					}
				}
			}
			for r, o := range obs {
				o.mu.Lock()
				if o.ops["compare_set"] == 0 || o.ops["wait"] == 0 {
					t.Errorf("rank %d: its store observed %v, want the rendezvous' compare_set and wait", r, o.ops)
				}
				o.mu.Unlock()
			}
		})
	}
}
