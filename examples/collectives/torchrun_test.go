package main

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTorchrunAgentStore runs `torchrun --nproc_per_node 2 --no_python -r 1
// -t 1 ./collectives` with no variable set by hand (-r 1 -t 1: see
// TestTorchrun). By default torchrun's agent serves a PyTorch TCPStore on
// MASTER_PORT and sets TORCHELASTIC_USE_AGENT_STORE=True: the ranks join it
// (comm/store/torchstore) instead of binding the port, and warn that it
// cannot check their token. With --standalone (the c10d rendezvous) the
// agent leaves MASTER_PORT free and rank 0 serves Tandem's own store there,
// which checks the token: no warning.
func TestTorchrunAgentStore(t *testing.T) {
	torchrun := need(t, "python3-torch", "torchrun")
	bin := program(t)
	port := func() string { return strconv.Itoa(freePort(t)) }
	for _, tc := range []struct {
		name    string
		flags   func() []string
		env     []string
		warns   int  // warnings that the store cannot check the token
		restart bool // rank 1 fails attempt 0
	}{
		{name: "agent-store", flags: func() []string { return []string{"--master_port", port()} }},
		{name: "agent-store-token", flags: func() []string { return []string{"--master_port", port()} },
			env: []string{"TANDEM_TOKEN=s3cret"}, warns: 2},
		{name: "standalone-token", flags: func() []string { return []string{"--standalone"} }, env: []string{"TANDEM_TOKEN=s3cret"}},
		// Rank 1 fails the first attempt; torchrun restarts both ranks with
		// TORCHELASTIC_RESTART_COUNT=1, and they meet under a fresh prefix
		// of the agent's store, where attempt 0's claims do not collide.
		{name: "agent-store-restart", restart: true, flags: func() []string {
			return []string{"--master_port", port(), "--max_restarts", "1"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			args := append([]string{"--nproc_per_node", "2", "--no_python", "-r", "1", "-t", "1",
				"--monitor_interval", "0.2", "--log_dir", t.TempDir()}, tc.flags()...)
			argv := []string{bin, "-timeout", "60s"}
			if tc.restart {
				argv = []string{"sh", "-c", `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then echo "rank 1 fails attempt 0"; exit 3; fi; exec "$0" -timeout 60s`, bin}
			}
			cmd := exec.CommandContext(ctx, torchrun, append(args, argv...)...)
			cmd.Env = append(baseEnv(), tc.env...)
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
