package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// torchPython is the interpreter of Debian's python3-torch, whose torchrun
// (torch 1.13) these tests start the tutorial under.
const torchPython = "/usr/bin/python3"

// needTorchrun skips the test where torch is not installed, except under CI
// (CI set), where .ci/run installs it and a missing torch is a failure.
func needTorchrun(t *testing.T) {
	t.Helper()
	out, err := exec.Command(torchPython, "-c", "import torch.distributed.run").CombinedOutput()
	if err == nil {
		return
	}
	msg := torchPython + " cannot import torch.distributed.run (" + err.Error() + ": " + strings.TrimSpace(string(out)) + "); install Debian's python3-torch"
	if os.Getenv("CI") == "" {
		t.Skip("skipping: " + msg)
	}
	t.Fatal(msg)
}

// buildForTorchrun builds the tutorial into a temporary directory.
func buildForTorchrun(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "collectives")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// torchrunFreePort returns a TCP port on 127.0.0.1 that was free a moment
// ago: torchrun's default, 29500, may be in use by another job.
func torchrunFreePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// torchrunEnv is this process's environment without the variables of a job
// or a launcher, so that the run depends on torchrun's alone.
func torchrunEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "RANK", name == "WORLD_SIZE", name == "LOCAL_RANK", name == "LOCAL_WORLD_SIZE",
			name == "MASTER_ADDR", name == "MASTER_PORT", name == "TANDEM_TOKEN",
			strings.HasPrefix(name, "TORCHELASTIC_"), strings.HasPrefix(name, "TANDEM_RESTART"),
			strings.HasPrefix(name, "OMPI_"), strings.HasPrefix(name, "PMI"), strings.HasPrefix(name, "SLURM_"),
			strings.HasPrefix(name, "PET_"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// TestTorchrun runs `torchrun --nproc_per_node 2 --no_python -r 1 -t 1
// ./collectives` with no variable set by hand (-r 1 -t 1: torch 1.13's
// torchrun fails on Python 3.11 without them, its redirect flags hitting an
// IntFlag change). By default torchrun's agent serves a TCPStore on
// MASTER_PORT and sets TORCHELASTIC_USE_AGENT_STORE=True: the ranks join it
// instead of binding the port. With --standalone (the c10d rendezvous) the
// agent leaves MASTER_PORT free and rank 0 serves Tandem's store there.
func TestTorchrun(t *testing.T) {
	needTorchrun(t)
	bin := buildForTorchrun(t)
	for _, tc := range []struct {
		name    string
		flags   func() []string
		env     []string
		warns   int  // warnings that the store cannot check the token
		restart bool // rank 1 fails attempt 0
	}{
		{name: "agent-store", flags: func() []string { return []string{"--master_port", torchrunFreePort(t)} }},
		{name: "agent-store-token", flags: func() []string { return []string{"--master_port", torchrunFreePort(t)} },
			env: []string{"TANDEM_TOKEN=s3cret"}, warns: 2},
		{name: "standalone", flags: func() []string { return []string{"--standalone"} }, env: []string{"TANDEM_TOKEN=s3cret"}},
		// Rank 1 fails the first attempt; torchrun restarts both ranks with
		// TORCHELASTIC_RESTART_COUNT=1, and they meet under a fresh prefix
		// of the agent's store, where attempt 0's claims do not collide.
		{name: "agent-store-restart", restart: true, flags: func() []string {
			return []string{"--master_port", torchrunFreePort(t), "--max_restarts", "1"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			args := append([]string{"-m", "torch.distributed.run", "--nproc_per_node", "2", "--no_python", "-r", "1", "-t", "1",
				"--monitor_interval", "0.2", "--log_dir", t.TempDir()}, tc.flags()...)
			argv := []string{bin, "-timeout", "60s"}
			if tc.restart {
				argv = []string{"sh", "-c", `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then echo "rank 1 fails attempt 0"; exit 3; fi; exec "$0" -timeout 60s`, bin}
			}
			cmd := exec.CommandContext(ctx, torchPython, append(args, argv...)...)
			cmd.Env = torchrunEnv(tc.env...)
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("torchrun: %v\n%s", err, out)
			}
			for r := range 2 {
				for _, want := range []string{"rank " + strconv.Itoa(r) + " of 2 joined", "all_reduce(sum)  -> [3 30]", "all_gather       -> [0 1]"} {
					if !strings.Contains(string(out), "[default"+strconv.Itoa(r)+"]:"+want) {
						t.Errorf("rank %d printed no %q:\n%s", r, want, out)
					}
				}
			}
			if tc.restart && !strings.Contains(string(out), "[default1]:rank 1 fails attempt 0") {
				t.Errorf("rank 1 did not fail the first attempt:\n%s", out)
			}
			if got := strings.Count(string(out), "cannot check TANDEM_TOKEN"); got != tc.warns {
				t.Errorf("%d warnings that the store cannot check the token, want %d:\n%s", got, tc.warns, out)
			}
		})
	}
}
