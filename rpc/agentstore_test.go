package rpc

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store/storetest"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/internal/testlog"
)

// TestAgentsJoinTorchrunAgentStore: under torchrun's static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True) the agents join the PyTorch TCPStore
// that torchrun's agent serves at MASTER_ADDR:MASTER_PORT (a Go one stands
// in for it here) under torch's "/worker/attempt_N" prefix, instead of
// worker 0 binding the port; with a token set each warns once that the
// store cannot check it, and the token still guards the calls.
func TestAgentsJoinTorchrunAgentStore(t *testing.T) {
	srv, err := torchstore.NewServer("127.0.0.1:0", torchstore.Unauthenticated())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	storetest.Serve(t, srv)
	for k, v := range map[string]string{"RANK": "", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(srv.Port()),
		"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "none",
		TokenEnv: "agent-store-secret"} {
		t.Setenv(k, v)
	}
	var logs testlog.Buffer
	agents := mustInitEach(t, ctx, 2, func(r int) (string, []Option) {
		return "", []Option{WithRegistry(basics(r)), WithLogger(logs.Logger())}
	})
	defer shutdownAll(agents)
	if v, err := Sync[int](ctx, agents[1], "worker0", "add", [2]int{2, 3}); err != nil || v != 5 {
		t.Fatalf("add: %v %v", v, err)
	}
	if string(agents[0].token) != "agent-store-secret" {
		t.Errorf("token %q, want TANDEM_TOKEN's", agents[0].token)
	}
	raw, err := torchstore.Dial(ctx, srv.Addr(), torchstore.WithKeyPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for r := range 2 {
		key := "//worker/attempt_2/rpc/worker/" + strconv.Itoa(r)
		if ok, err := raw.Check(ctx, []string{key}); err != nil || !ok {
			t.Errorf("key %q in the agent store: %v, %v; want it there", key, ok, err)
		}
	}
	if v, err := raw.Add(ctx, torchstore.InitKey, 0); err != nil || v != 2 {
		t.Errorf("init/ counter = %d, %v; want 2", v, err)
	}
	if got := strings.Count(logs.String(), "cannot check TANDEM_TOKEN"); got != 2 {
		t.Errorf("%d warnings about the unauthenticated store, want one per worker:\n%s", got, logs.String())
	}
}
