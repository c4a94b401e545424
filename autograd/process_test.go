package autograd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
)

// helperEnv makes the test binary act as the worker process of
// TestBackwardProcessKilled; its value is the store's address.
const helperEnv = "TANDEM_AUTOGRAD_TEST_HELPER"

// TestHelperStageWorker is the body of the worker process; it does nothing
// in a normal test run.
func TestHelperStageWorker(t *testing.T) {
	addr := os.Getenv(helperEnv)
	if addr == "" {
		t.Skip("runs only as the helper process of TestBackwardProcessKilled")
	}
	os.Exit(helperStageWorker(addr))
}

func helperStageWorker(addr string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "store:", err)
		return 1
	}
	defer st.Close()
	reg := rpc.NewRegistry()
	registerFaulty(func(bctx context.Context) error {
		// Say that the backward pass arrived, then hang until killed.
		st.Set(ctx, "test/backward-started", []byte{1})
		<-bctx.Done()
		return context.Cause(bctx)
	})(reg)
	a, err := rpc.Init(ctx, "w1", 1, 2, rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0"), rpc.WithExtensions(Extension()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	<-ctx.Done() // the test kills this process long before
	a.Close()
	return 1
}

// A worker process killed with SIGKILL in the middle of a backward pass:
// the driver's Backward fails with ErrPeerLost within seconds, and ending
// the context reports the worker it could not reach and leaves nothing
// behind on the driver.
func TestBackwardProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperStageWorker$")
	cmd.Env = append(os.Environ(), helperEnv+"="+st.Addr())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	a, err := rpc.Init(ctx, "w0", 0, 2, rpc.WithStore(st), rpc.WithListenAddr("127.0.0.1:0"), rpc.WithExtensions(Extension()))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	rng := rand.New(rand.NewPCG(1, 3))
	x, target := randDense(rng, 2, 3), randDense(rng, 2, 3)
	lossFn := mseFunction()
	start := time.Now()
	err = WithContext(ctx, a, func(ctx context.Context, c *Context) error {
		if err := c.RequireGrad(x); err != nil {
			return err
		}
		y, err := rpc.Sync[*tensor.Dense](ctx, a, "w1", "faulty.forward", x)
		if err != nil {
			return err
		}
		l, err := lossFn.Apply(ctx, c, y, target)
		if err != nil {
			return err
		}
		go func() {
			if err := st.Wait(ctx, []string{"test/backward-started"}, 30*time.Second); err == nil {
				cmd.Process.Kill()
			}
		}()
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = c.Backward(bctx, l[0])
		if !errors.Is(err, rpc.ErrPeerLost) {
			t.Errorf("Backward: %v; want ErrPeerLost", err)
		}
		return err
	})
	if err == nil {
		t.Fatal("the step succeeded")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("failed by a network timeout rather than at once: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("failing took %v", d)
	}
	if n := len(Contexts(a)); n != 0 {
		t.Errorf("the driver holds %d contexts", n)
	}
	t.Logf("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
}
