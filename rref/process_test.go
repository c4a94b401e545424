package rref

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
	"gorgonia.org/tensor"
)

const helperEnv = "TANDEM_RREF_TEST_HELPER"

// TestHelperOwner is the body of the owner process that
// TestOwnerProcessKilled starts; it does nothing in a normal test run.
func TestHelperOwner(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs only as a helper process of TestOwnerProcessKilled")
	}
	reg := rpc.NewRegistry()
	setup(holders(2))(reg)
	a, err := rpc.InitFromEnv(context.Background(), "owner", rpc.WithRegistry(reg), rpc.WithExtensions(Extension()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	<-a.ShuttingDown() // serve until killed
	os.Exit(0)
}

func TestOwnerProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, port, _ := net.SplitHostPort(st.Addr())
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOwner$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "TANDEM_TOKEN=t")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	reg := rpc.NewRegistry()
	setup(holders(2))(reg)
	a, err := rpc.Init(ctx, "user", 0, 2, rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithExtensions(Extension()), rpc.WithToken("t"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	defer a.Close()

	ref, err := Remote[*tensor.Dense](ctx, a, "owner", "ones", 8)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ref.ToHere(ctx); err != nil || sum(v) != 8 {
		t.Fatalf("ToHere: %v %v", v, err)
	}
	// The owner dies; ToHere fails within the timeout, naming the loss.
	cmd.Process.Kill()
	cmd.Wait()
	start := time.Now()
	_, err = ref.ToHere(ctx, rpc.WithTimeout(5*time.Second))
	if !errors.Is(err, rpc.ErrPeerLost) && !errors.Is(err, rpc.ErrTimeout) {
		t.Fatalf("ToHere after the owner died: %v", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("took %v", d)
	}
	// Releasing a reference to a dead owner reports it.
	if err := ref.Release(ctx); !errors.Is(err, rpc.ErrPeerLost) {
		t.Fatalf("Release with a dead owner: %v", err)
	}
}
