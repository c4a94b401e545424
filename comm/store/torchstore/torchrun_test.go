package torchstore

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// workerEnv marks a run of this test binary as a worker that torchrun
// started (see TestMain).
const workerEnv = "TORCHSTORE_TEST_TORCHRUN_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(torchrunWorker())
	}
	os.Exit(m.Run())
}

// torchrunWorker is what each worker process runs: it joins the agent's
// store the way torch's env:// initialisation does with
// TORCHELASTIC_USE_AGENT_STORE=True, and rendezvous with the other workers.
func torchrunWorker() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "worker rank %s: %s\n", os.Getenv("RANK"), fmt.Sprintf(format, args...))
		return 1
	}
	if os.Getenv("TORCHELASTIC_USE_AGENT_STORE") != "True" {
		return fail("TORCHELASTIC_USE_AGENT_STORE=%q, want True", os.Getenv("TORCHELASTIC_USE_AGENT_STORE"))
	}
	rank, err1 := strconv.Atoi(os.Getenv("RANK"))
	world, err2 := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if err1 != nil || err2 != nil {
		return fail("RANK=%q WORLD_SIZE=%q", os.Getenv("RANK"), os.Getenv("WORLD_SIZE"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	c, err := Dial(ctx, addr, CountIn())
	if err != nil {
		return fail("%v", err)
	}
	defer c.Close()
	s := store.NewPrefix("/worker/attempt_"+os.Getenv("TORCHELASTIC_RESTART_COUNT"), c)
	if rank == 0 {
		if err := s.Set(ctx, "greeting", []byte("hello from rank 0")); err != nil {
			return fail("%v", err)
		}
	}
	greeting, err := s.Get(ctx, "greeting")
	if err != nil {
		return fail("%v", err)
	}
	if _, err := s.Add(ctx, "arrived", 1); err != nil {
		return fail("%v", err)
	}
	if err := s.Set(ctx, "rank"+strconv.Itoa(rank), []byte("here")); err != nil {
		return fail("%v", err)
	}
	var keys []string
	for r := range world {
		keys = append(keys, "rank"+strconv.Itoa(r))
	}
	if err := s.Wait(ctx, keys, 0); err != nil {
		return fail("%v", err)
	}
	n, err := s.Add(ctx, "arrived", 0)
	if err != nil {
		return fail("%v", err)
	}
	fmt.Printf("worker %d of %d read %q, %d arrived\n", rank, world, greeting, n)
	return 0
}

// TestTorchrunWorkersJoinAgentStore: torchrun (torch 1.13) starts two Go
// workers with TORCHELASTIC_USE_AGENT_STORE=True; they join the agent's
// TCPStore and meet there.
func TestTorchrunWorkersJoinAgentStore(t *testing.T) {
	if out, err := exec.Command(python, "-c", "import torch.distributed.run").CombinedOutput(); err != nil {
		t.Skipf("skipping: %s cannot import torch.distributed.run (%v: %s); install Debian's python3-torch to run it",
			python, err, strings.TrimSpace(string(out)))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx := ctxFor(t, 120*time.Second)
	// -r 1 -t 1: torch 1.13's torchrun fails on Python 3.11 without them
	// (its redirect flags hit an IntFlag change).
	cmd := exec.CommandContext(ctx, python, "-m", "torch.distributed.run",
		"--nproc_per_node", "2", "--no_python", "-r", "1", "-t", "1", "--monitor_interval", "0.2",
		"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port),
		os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torchrun: %v\n%s", err, out)
	}
	for r := range 2 {
		want := fmt.Sprintf("worker %d of 2 read \"hello from rank 0\", 2 arrived", r)
		if !strings.Contains(string(out), want) {
			t.Fatalf("torchrun output lacks %q:\n%s", want, out)
		}
	}
}
