package store

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Multi-process tests re-run this test binary as the children: with
// helperEnv set, TestHelperStoreProcess plays one rank against the store the
// environment names and exits.
const helperEnv = "TANDEM_STORE_TEST_HELPER"

// TestHelperStoreProcess is the child's body, not a test of its own: outside
// a child it returns at once.
func TestHelperStoreProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		return
	}
	if err := runRank(spec); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runRank plays rank `rank` of `world` through the store described by spec
// ("tcp ADDR RANK WORLD" or "file PATH RANK WORLD"): every rank publishes a
// value, counts itself in, waits for everyone, reads everyone's value, and
// appends to a shared log; rank 0 checks the result.
func runRank(spec string) error {
	f := strings.Fields(spec)
	if len(f) != 4 {
		return fmt.Errorf("bad helper spec %q", spec)
	}
	rank, _ := strconv.Atoi(f[2])
	world, _ := strconv.Atoi(f[3])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s Store
	var err error
	switch f[0] {
	case "tcp":
		s, err = Dial(ctx, f[1], WithToken("proc-secret"), WithLogger(quietLogger()))
	case "file":
		s, err = NewFile(f[1], WithPollInterval(10*time.Millisecond))
	default:
		err = fmt.Errorf("unknown store kind %q", f[0])
	}
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Set(ctx, fmt.Sprintf("value/%d", rank), []byte(fmt.Sprintf("from %d", rank))); err != nil {
		return err
	}
	for range 20 {
		if _, err := s.Add(ctx, "counter", 1); err != nil {
			return err
		}
	}
	if err := s.Append(ctx, "log", []byte{byte('a' + rank)}); err != nil {
		return err
	}
	if _, err := s.Add(ctx, "arrived", 1); err != nil {
		return err
	}
	if rank == 0 {
		for {
			n, err := s.Add(ctx, "arrived", 0)
			if err != nil {
				return err
			}
			if n == int64(world) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := s.Set(ctx, "go", []byte("1")); err != nil {
			return err
		}
	}
	// Everyone but rank 0 blocks here until rank 0 saw all arrive.
	if _, err := s.Get(ctx, "go"); err != nil {
		return err
	}
	keys := make([]string, world)
	for i := range keys {
		keys[i] = fmt.Sprintf("value/%d", i)
	}
	vals, err := s.MultiGet(ctx, keys)
	if err != nil {
		return err
	}
	for i, v := range vals {
		if string(v) != fmt.Sprintf("from %d", i) {
			return fmt.Errorf("rank %d read %q for rank %d", rank, v, i)
		}
	}
	c, err := s.Add(ctx, "counter", 0)
	if err != nil {
		return err
	}
	if c != int64(20*world) {
		return fmt.Errorf("counter = %d, want %d", c, 20*world)
	}
	log, err := s.Get(ctx, "log")
	if err != nil {
		return err
	}
	if len(log) != world {
		return fmt.Errorf("log %q has %d entries, want %d", log, len(log), world)
	}
	_, err = s.Add(ctx, "finished", 1)
	return err
}

// runProcesses starts world children with spec(rank) and waits for them.
func runProcesses(t *testing.T, world int, spec func(rank int) string) {
	t.Helper()
	var wg sync.WaitGroup
	for rank := range world {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStoreProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"="+spec(rank))
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("rank %d: %v\n%s", rank, err, out)
			}
		})
	}
	wg.Wait()
}

func TestTCPManyProcesses(t *testing.T) {
	const world = 4
	srv := startServer(t, WithToken("proc-secret"))
	runProcesses(t, world, func(rank int) string {
		return fmt.Sprintf("tcp %s %d %d", srv.Addr(), rank, world)
	})
	s := dialT(t, srv.Addr(), WithToken("proc-secret"))
	if n := must(s.Add(ctxFor(t, long), "finished", 0)).get(t); n != world {
		t.Fatalf("%d ranks finished, want %d", n, world)
	}
}

func TestFileManyProcesses(t *testing.T) {
	const world = 4
	path := filepath.Join(t.TempDir(), "store")
	runProcesses(t, world, func(rank int) string {
		return fmt.Sprintf("file %s %d %d", path, rank, world)
	})
	s, err := NewFile(path)
	noErr(t, err)
	defer s.Close()
	if n := must(s.Add(ctxFor(t, long), "finished", 0)).get(t); n != world {
		t.Fatalf("%d ranks finished, want %d", n, world)
	}
}
