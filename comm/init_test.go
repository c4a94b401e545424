package comm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/internal/testlog"
	"gorgonia.org/tensor"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// noEnv is an empty environment, so tests do not depend on the caller's.
func noEnv() InitOption { return withLookupEnv(lookupMap(map[string]string{})) }

// initAll runs init for ranks 0..n-1 concurrently and returns what each got.
func initAll(n int, init func(rank int) (*ProcessGroup, error)) ([]*ProcessGroup, []error) {
	pgs := make([]*ProcessGroup, n)
	errs := testkit.EachRank(n, func(r int) (err error) {
		pgs[r], err = init(r)
		return err
	})
	return pgs, errs
}

func closeAll(pgs []*ProcessGroup) {
	var wg sync.WaitGroup
	for _, pg := range pgs {
		if pg != nil {
			wg.Add(1)
			go func() { defer wg.Done(); pg.Close() }()
		}
	}
	wg.Wait()
}

// checkAllReduce all-reduces rank+1 on every rank and checks the sum.
func checkAllReduce(t *testing.T, pgs []*ProcessGroup) {
	t.Helper()
	n := len(pgs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := tensor.New(tensor.WithShape(1000), tensor.Of(tensor.Float32))
			for i := range x.Data().([]float32) {
				x.Data().([]float32)[i] = float32(r + 1)
			}
			if err := pg.AllReduce(ctx, x, Sum).Wait(ctx); err != nil {
				t.Errorf("rank %d: all_reduce: %v", r, err)
				return
			}
			want := float32(n * (n + 1) / 2)
			if got := x.Data().([]float32)[999]; got != want {
				t.Errorf("rank %d: all_reduce gave %v, want %v", r, got, want)
			}
		}()
	}
	wg.Wait()
}

func requireAll(t *testing.T, pgs []*ProcessGroup, errs []error) {
	t.Helper()
	t.Cleanup(func() { closeAll(pgs) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestInitTCPURL(t *testing.T) {
	const n = 3
	port := freePort(t)
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		return Init(context.Background(), fmt.Sprintf("tcp://127.0.0.1:%d?rank=%d&world_size=%d", port, r, n),
			noEnv(), WithoutDefault(), WithToken("t0k"), WithInitTimeout(30*time.Second))
	})
	requireAll(t, pgs, errs)
	for r, pg := range pgs {
		if pg.Rank() != r || pg.Size() != n {
			t.Fatalf("group %d reports rank %d of %d", r, pg.Rank(), pg.Size())
		}
	}
	checkAllReduce(t, pgs)
}

func TestInitFromEnvVariables(t *testing.T) {
	const n = 2
	port := strconv.Itoa(freePort(t))
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		env := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "LOCAL_RANK": strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": "2", "MASTER_PORT": port, "TANDEM_TOKEN": "from-env"}
		return InitFromEnv(context.Background(), withLookupEnv(lookupMap(env)), WithoutDefault())
	})
	requireAll(t, pgs, errs)
	checkAllReduce(t, pgs)
}

func TestInitWithStoreAndOptions(t *testing.T) {
	const n = 4
	st := store.NewMemory()
	defer st.Close()
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		return Init(context.Background(), "env://", noEnv(), WithStore(st), WithRank(r), WithWorldSize(n),
			WithoutDefault(), WithGroupOptions(WithName("custom")))
	})
	requireAll(t, pgs, errs)
	if pgs[0].Name() != "custom" {
		t.Errorf("group options not applied: name %q", pgs[0].Name())
	}
	checkAllReduce(t, pgs)
	closeAll(pgs)
	// The caller's store stays open.
	if err := st.Set(context.Background(), "still", []byte("open")); err != nil {
		t.Errorf("WithStore's store was closed by the group: %v", err)
	}
}

func TestInitWorldOfOneNeedsNothing(t *testing.T) {
	pg, err := Init(context.Background(), "env://", withLookupEnv(lookupMap(map[string]string{"RANK": "0", "WORLD_SIZE": "1"})), WithoutDefault())
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	checkAllReduce(t, []*ProcessGroup{pg})
}

func TestInitBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		opts []InitOption
		says string
	}{
		{"tcp://no-port?rank=0&world_size=2", nil, "tcp://HOST:PORT"},
		{"tcp://127.0.0.1:99999?rank=0&world_size=2", nil, "99999"},
		{"tcp://127.0.0.1:5?rank=0&world_size=2&bogus=1", nil, `unknown parameter "bogus"`},
		{"tcp://127.0.0.1:5?rank=x&world_size=2", nil, `rank="x"`},
		{"udp://127.0.0.1:5", nil, `unknown scheme "udp"`},
		{"127.0.0.1:5", nil, "use env://"},
		{"env://somewhere", nil, "env:// takes no address"},
		{"file://host/tmp/x?rank=0&world_size=1", nil, "file:///PATH"},
		{"file:///tmp/x?rank=0", nil, "WORLD_SIZE"},
		{"tcp://127.0.0.1:5?rank=1&world_size=2", []InitOption{WithRank(0)}, "rank given twice"},
		{"tcp://127.0.0.1:5?rank=0&world_size=2", []InitOption{WithWorldSize(3)}, "world size given twice"},
		{"tcp://127.0.0.1:5?rank=5&world_size=2", nil, "out of range"},
		{"env://", []InitOption{WithRank(0)}, "WORLD_SIZE"},
		{"env://", []InitOption{WithRank(2), WithWorldSize(2)}, "out of range"},
		{"env://", []InitOption{WithRank(0), WithWorldSize(2), WithStore(store.NewMemory()), WithBackend("carrier-pigeon")}, `no backend named "carrier-pigeon"`},
		{"tcp://127.0.0.1:5?rank=0&world_size=2", []InitOption{WithStore(store.NewMemory())}, "both name a store"},
	} {
		_, err := Init(ctx, tc.url, append([]InitOption{noEnv(), WithoutDefault()}, tc.opts...)...)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: want ErrInvalidArgument, got %v", tc.url, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: error %q does not mention %q", tc.url, err, tc.says)
		}
	}
}

func TestInitFileURL(t *testing.T) {
	const n = 3
	path := filepath.Join(t.TempDir(), "store")
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		return Init(context.Background(), fmt.Sprintf("file://%s?rank=%d&world_size=%d", path, r, n), noEnv(), WithoutDefault())
	})
	requireAll(t, pgs, errs)
	checkAllReduce(t, pgs)
	closeAll(pgs)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the last rank to leave did not remove the file store: %v", err)
	}
	// A second run on the same path starts clean.
	pgs, errs = initAll(n, func(r int) (*ProcessGroup, error) {
		return Init(context.Background(), fmt.Sprintf("file://%s?rank=%d&world_size=%d", path, r, n), noEnv(), WithoutDefault())
	})
	requireAll(t, pgs, errs)
	checkAllReduce(t, pgs)
}

func TestInitFileLeftOverIsExplained(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	// A crashed run left its claims behind.
	st, err := store.NewFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Set(context.Background(), "tandem/rdzv/rank/0", []byte("world=1 host=elsewhere pid=42 id=0")); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, err = Init(context.Background(), "file://"+path+"?rank=0&world_size=1", noEnv(), WithoutDefault(), WithInitTimeout(5*time.Second))
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("want ErrMismatch, got %v", err)
	}
	for _, s := range []string{"already taken", "pid 42", "left over", path} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestInitFromEnvMissingVariable(t *testing.T) {
	_, err := InitFromEnv(context.Background(), noEnv(), WithoutDefault())
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("want ErrInvalidArgument, got %v", err)
	}
	for _, s := range []string{"WORLD_SIZE", "tandem run"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	_, err = InitFromEnv(context.Background(), withLookupEnv(lookupMap(map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})), WithoutDefault())
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "MASTER_PORT") {
		t.Fatalf("want ErrInvalidArgument naming MASTER_PORT, got %v", err)
	}
}

func TestInitSetsDefaultOnce(t *testing.T) {
	old := SetDefault(nil)
	defer SetDefault(old)
	st := store.NewMemory()
	defer st.Close()
	pg1, err := Init(context.Background(), "env://", noEnv(), WithStore(st), WithRank(0), WithWorldSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer pg1.Close()
	if Default() != pg1 {
		t.Fatal("the first group Init returns is not the default")
	}
	st2 := store.NewMemory()
	defer st2.Close()
	pg2, err := Init(context.Background(), "env://", noEnv(), WithStore(st2), WithRank(0), WithWorldSize(1))
	if err != nil {
		t.Fatal(err)
	}
	defer pg2.Close()
	if Default() != pg1 {
		t.Fatal("a later Init replaced the default group")
	}
	if prev := SetDefault(pg2); prev != pg1 || Default() != pg2 {
		t.Fatal("SetDefault did not swap the default group")
	}
}

func TestInitCloseLeavesNoGoroutines(t *testing.T) {
	runtime.GC()
	base := runtime.NumGoroutine()
	for i := 0; i < 2; i++ {
		port := freePort(t)
		pgs, errs := initAll(3, func(r int) (*ProcessGroup, error) {
			return Init(context.Background(), fmt.Sprintf("tcp://127.0.0.1:%d?rank=%d&world_size=3", port, r), noEnv(), WithoutDefault())
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		checkAllReduce(t, pgs)
		closeAll(pgs)
	}
	testkit.AssertNoLeak(t, base)
}

// helperEnv selects the role of a re-executed test binary (see
// TestHelperInitProcess).
const helperEnv = "TANDEM_COMM_INIT_HELPER"

// TestHelperInitProcess is not a test: it is the body of the worker
// processes that TestKilledRankMidAllReduce starts by re-executing this test
// binary. It joins the world from the environment and all-reduces until an
// operation fails, then reports the error on stdout and exits.
func TestHelperInitProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "allreduce" {
		t.Skip("helper process for TestKilledRankMidAllReduce")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := InitFromEnv(ctx, WithInitTimeout(30*time.Second), WithGroupOptions(WithTimeout(time.Minute)))
	if err != nil {
		fmt.Printf("INITERR %v\n", err)
		os.Exit(2)
	}
	x := tensor.New(tensor.WithShape(1<<18), tensor.Of(tensor.Float32))
	for i := 0; ; i++ {
		if err := pg.AllReduce(ctx, x, Sum).Wait(ctx); err != nil {
			fmt.Printf("ERR peerlost=%v timeout=%v: %v\n", errors.Is(err, ErrPeerLost), errors.Is(err, ErrTimeout), err)
			pg.Close()
			os.Exit(3)
		}
		if i == 0 {
			fmt.Println("READY")
		}
	}
}

// TestKilledRankMidAllReduce runs a world of three real processes that
// all-reduce in a loop, kills one with SIGKILL, and checks that every
// survivor's collective fails with ErrPeerLost promptly instead of hanging
// until its one-minute timeout.
func TestKilledRankMidAllReduce(t *testing.T) {
	for _, victim := range []int{1, 0} { // 0 also serves the store
		t.Run(fmt.Sprintf("kill rank %d", victim), func(t *testing.T) {
			const world = 3
			port := freePort(t)
			type proc struct {
				cmd   *exec.Cmd
				lines chan string
			}
			procs := make([]proc, world)
			for r := range procs {
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperInitProcess$")
				cmd.Env = append(os.Environ(), helperEnv+"=allreduce",
					"RANK="+strconv.Itoa(r), "WORLD_SIZE=3", "LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE=3",
					"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "TANDEM_TOKEN=kill-test")
				cmd.Stderr = os.Stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				lines := make(chan string, 16)
				go func() {
					sc := bufio.NewScanner(out)
					for sc.Scan() {
						lines <- sc.Text()
					}
					close(lines)
				}()
				procs[r] = proc{cmd, lines}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			}
			next := func(r int, within time.Duration) string {
				select {
				case l, ok := <-procs[r].lines:
					if !ok {
						return "(exited without a word)"
					}
					return l
				case <-time.After(within):
					return fmt.Sprintf("(nothing within %v)", within)
				}
			}
			for r := range procs {
				if l := next(r, 60*time.Second); l != "READY" {
					t.Fatalf("rank %d did not start all-reducing: %s", r, l)
				}
			}
			killed := time.Now()
			if err := procs[victim].cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			for r := range procs {
				if r == victim {
					continue
				}
				// The bound only guards against a hang; survivors should
				// report within milliseconds, far below the group timeout.
				l := next(r, 30*time.Second)
				if !strings.HasPrefix(l, "ERR peerlost=true timeout=false") {
					t.Errorf("rank %d: want ErrPeerLost, got %s", r, l)
				}
				t.Logf("rank %d reported after %v: %s", r, time.Since(killed).Round(time.Millisecond), l)
			}
		})
	}
}

// Two ranks, here goroutines sharing an in-memory store, join a world and
// all-reduce. Real jobs run one process per rank and call
// comm.InitFromEnv(ctx) under `tandem run` (or torchrun, mpirun, srun),
// which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
func ExampleInit() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := store.NewMemory()
	defer st.Close()
	var wg sync.WaitGroup
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pg, err := Init(ctx, "env://", WithStore(st), WithRank(rank), WithWorldSize(2), WithoutDefault())
			if err != nil {
				fmt.Println(err)
				return
			}
			defer pg.Close()
			x := tensor.New(tensor.WithBacking([]float32{float32(rank), 1, 2}))
			if err := pg.AllReduce(ctx, x, Sum).Wait(ctx); err != nil {
				fmt.Println(err)
				return
			}
			if rank == 0 {
				fmt.Println("sum:", x.Data())
			}
			// Leave together: no rank closes while another still needs it.
			pg.Barrier(ctx).Wait(ctx)
		}()
	}
	wg.Wait()
	// Output: sum: [1 2 4]
}

// TestInitJoinsTorchrunAgentStore: with TORCHELASTIC_USE_AGENT_STORE=True,
// as torchrun's static rendezvous sets it, no rank binds MASTER_PORT (a
// PyTorch TCPStore, standing in for the agent's, already serves it); every
// rank joins it, counts itself in as torch's workers do, and meets under
// "/worker/attempt_N" for TORCHELASTIC_RESTART_COUNT=N. A token set for the
// job draws one warning per rank: the store cannot check it.
func TestInitJoinsTorchrunAgentStore(t *testing.T) {
	srv, err := torchstore.NewServer("127.0.0.1:0", torchstore.Unauthenticated())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() { srv.Close(); <-served }()

	var logs testlog.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	const n = 2
	pgs, errs := initAll(n, func(r int) (*ProcessGroup, error) {
		env := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "2", "LOCAL_RANK": strconv.Itoa(r),
			"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(srv.Port()),
			"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "3",
			"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "none", "TANDEM_TOKEN": "secret"}
		return InitFromEnv(ctx, withLookupEnv(lookupMap(env)), WithoutDefault(),
			WithGroupOptions(WithLogger(logger)))
	})
	requireAll(t, pgs, errs)
	checkAllReduce(t, pgs)

	// What a torch worker of attempt 3 would see, and the count torch's
	// TCPStore clients keep.
	raw, err := torchstore.Dial(ctx, srv.Addr(), torchstore.WithKeyPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if v, err := raw.Add(ctx, torchstore.InitKey, 0); err != nil || v != n {
		t.Errorf("init/ counter = %d, %v; want %d (every rank counted in)", v, err, n)
	}
	for r := range n {
		key := "//worker/attempt_3/tandem/rdzv/rank/" + strconv.Itoa(r)
		if ok, err := raw.Check(ctx, []string{key}); err != nil || !ok {
			t.Errorf("key %q in the agent store: %v, %v; want it there", key, ok, err)
		}
	}
	if got := strings.Count(logs.String(), "cannot check TANDEM_TOKEN"); got != n {
		t.Errorf("%d warnings about the unauthenticated store, want one per rank (%d):\n%s", got, n, logs.String())
	}
	closeAll(pgs)
}

// TestInitAgentStoreUnreachable: a rank told that torchrun's agent serves
// the store, where nothing listens, fails naming torchrun and the fix.
func TestInitAgentStoreUnreachable(t *testing.T) {
	env := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(freePort(t)),
		"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}
	_, err := InitFromEnv(context.Background(), withLookupEnv(lookupMap(env)), WithoutDefault(), WithInitTimeout(500*time.Millisecond))
	if err == nil {
		t.Fatal("InitFromEnv succeeded with no agent store")
	}
	for _, want := range []string{"detected torchrun", "torchrun's agent store", "TORCHELASTIC_USE_AGENT_STORE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}
