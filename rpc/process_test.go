package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// helperEnv makes the test binary act as a worker process of a multi-process
// test (see TestHelperWorker).
const helperEnv = "TANDEM_RPC_TEST_HELPER"

// TestHelperWorker is the body of the worker processes that the
// multi-process tests start; it does nothing in a normal test run.
func TestHelperWorker(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs only as a helper process of TestMultiProcess")
	}
	os.Exit(helperWorker())
}

func helperWorker() int {
	ctx := context.Background()
	reg := NewRegistry()
	registerBasics(0, reg)
	must(Register(reg, "pid", func(ctx context.Context, _ struct{}) (int, error) { return os.Getpid(), nil }))
	a, err := InitFromEnv(ctx, "", WithRegistry(reg))
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	if os.Getenv("TEST_MODE") == "serve" {
		// Serve, never shutting down, until the test kills this process
		// (or, should the test die first, for a while).
		time.Sleep(2 * time.Minute)
		return 0
	}
	d, _ := time.ParseDuration(os.Getenv("TEST_SHUTDOWN"))
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// Serve until the whole group shuts down (or, with a dead worker, until
	// the watch finds it lost).
	err = a.Shutdown(sctx)
	if err != nil && !(errors.Is(err, ErrPeerLost) && strings.Contains(err.Error(), "worker2")) {
		fmt.Fprintln(os.Stderr, "shutdown:", err)
		return 1
	}
	fmt.Println("helper shutdown:", err)
	return 0
}

func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx := testkit.Context(t, 60*time.Second)
	const token = "multi-process-test-token"
	st, port := masterStore(t, ctx, token)

	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	children := map[int]*child{}
	for _, r := range []int{1, 2} {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestHelperWorker$")}
		c.cmd.Env = append(os.Environ(), helperEnv+"=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE=3",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, TokenEnv+"="+token, "TEST_SHUTDOWN=4s")
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[r] = c
		defer c.cmd.Process.Kill()
	}
	reg := NewRegistry()
	registerBasics(0, reg)
	a, err := Init(ctx, "", 0, 3, WithStore(st), WithRegistry(reg), WithToken(token))
	if err != nil {
		t.Fatal(err)
	}

	// Every call form across processes.
	x := dense([]int{256, 4}, make([]float32, 1024))
	x.Data().([]float32)[1023] = 5
	if y, err := Sync[*tensor.Dense](ctx, a, "worker1", "echo", x); err != nil || !sameTensor(x, y) {
		t.Fatalf("echo: %v", err)
	}
	if v, err := Sync[int](ctx, a, "worker1", "relay", [2]int{2, 3}); err != nil || v != 5 {
		t.Fatalf("relay through worker1 to worker2: %v %v", v, err)
	}
	var futs []*Future[int]
	for i := 0; i < 50; i++ {
		futs = append(futs, Async[int](ctx, a, "worker2", "add", [2]int{i, 1}))
	}
	for i, f := range futs {
		if v, err := f.Wait(ctx); err != nil || v != i+1 {
			t.Fatalf("async %d: %v %v", i, v, err)
		}
	}
	if _, err := Sync[int](ctx, a, "worker1", "nope", 1); !errors.Is(err, ErrUnknownFunction) {
		t.Fatalf("unknown function: %v", err)
	}
	if _, err := Sync[int](ctx, a, "worker1", "boom", struct{}{}); !errors.Is(err, ErrPanic) {
		t.Fatalf("panic: %v", err)
	}
	pid1, err := Sync[int](ctx, a, "worker1", "pid", struct{}{})
	if err != nil || pid1 != children[1].cmd.Process.Pid {
		t.Fatalf("worker1 survives the panic: pid %v (want %d) %v", pid1, children[1].cmd.Process.Pid, err)
	}

	// Bad bytes to a real worker process close only that connection.
	nc, err := net.Dial("tcp", a.addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	nc.Write(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 100))
	if _, err := nc.Read(make([]byte, 4096)); err == nil {
		nc.Read(make([]byte, 4096))
	}
	nc.Close()
	if y, err := Sync[*tensor.Dense](ctx, a, "worker1", "echo", x); err != nil || !sameTensor(x, y) {
		t.Fatalf("echo after bad bytes: %v", err)
	}

	// A killed worker: the call in flight fails with ErrPeerLost, and so do
	// later calls.
	slow := Async[string](ctx, a, "worker2", "sleep", time.Minute)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := children[2].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	children[2].cmd.Wait()
	if _, err := slow.Wait(ctx); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("call to a killed worker: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the dead worker took %v to notice", d)
	}
	if _, err := Sync[int](ctx, a, "worker2", "add", [2]int{1, 1}, WithTimeout(5*time.Second)); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("call after the worker died: %v", err)
	}
	// worker1 is unaffected.
	if v, err := Sync[int](ctx, a, "worker1", "add", [2]int{1, 1}); err != nil || v != 2 {
		t.Fatalf("worker1 after worker2 died: %v %v", v, err)
	}

	// Graceful shutdown with a dead worker: fails at once, naming it, well
	// before the context's deadline.
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	start = time.Now()
	err = a.Shutdown(sctx)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "worker2") {
		t.Fatalf("graceful shutdown with a dead worker: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("graceful shutdown with a dead worker took %v", d)
	}
	if err := children[1].cmd.Wait(); err != nil {
		t.Fatalf("worker1 exited with %v:\n%s", err, children[1].out.String())
	}
}
