package autograd

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/rpc"
)

// registerFaulty registers, besides the stages, "faulty.forward": the
// identity, recorded with a backward function that calls onBackward.
func registerFaulty(onBackward func(ctx context.Context) error) func(reg *rpc.Registry) {
	return func(reg *rpc.Registry) {
		registerStage(reg)
		err := rpc.Register(reg, "faulty.forward", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			out := x.Clone().(*tensor.Dense)
			c := FromContext(ctx)
			if c == nil {
				return out, nil
			}
			err := c.Record("faulty", []*tensor.Dense{x}, []*tensor.Dense{out}, func(ctx context.Context, g []*tensor.Dense) ([]*tensor.Dense, error) {
				if err := onBackward(ctx); err != nil {
					return nil, err
				}
				return g, nil
			})
			return out, err
		})
		if err != nil {
			panic(err)
		}
	}
}

// failingStep runs stage 1 on w1, the faulty function on w2 and the loss on
// w0, then Backward; check runs inside the context after Backward failed.
func failingStep(t *testing.T, ctx context.Context, agents []*rpc.Agent, backwardCtx func(context.Context) (context.Context, context.CancelFunc), check func(c *Context, err error)) error {
	t.Helper()
	stage1, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", stageConfig{In: 3, Out: 4, Tanh: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer stage1.Close(ctx)
	rng := rand.New(rand.NewPCG(1, 1))
	x, target := randDense(rng, 2, 3), randDense(rng, 2, 4)
	lossFn := mseFunction()
	return WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		h, err := stage1.Forward(ctx, c, x)
		if err != nil {
			return err
		}
		y, err := rpc.Sync[*tensor.Dense](ctx, agents[0], "w2", "faulty.forward", h)
		if err != nil {
			return err
		}
		l, err := lossFn.Apply(ctx, c, y, target)
		if err != nil {
			return err
		}
		bctx, cancel := backwardCtx(ctx)
		defer cancel()
		err = c.Backward(bctx, l[0])
		check(c, err)
		return err
	})
}

func withTimeout(d time.Duration) func(context.Context) (context.Context, context.CancelFunc) {
	return func(ctx context.Context) (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) }
}

// partErr returns the error recorded in agent a's part of context id.
func partErr(a *rpc.Agent, id ContextID) error {
	c, ok := Lookup(a, id)
	if !ok {
		return errors.New("no part of the context")
	}
	return c.Err()
}

// A backward function failing on one worker fails the pass on every
// worker, promptly, and the context is released everywhere.
func TestBackwardHandlerErrorReachesEveryone(t *testing.T) {
	testkit.CheckLeaks(t, testkit.Slack(2))
	agents := startGroup(t, 3, registerFaulty(func(context.Context) error { return errors.New("boom in backward") }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := failingStep(t, ctx, agents, withTimeout(20*time.Second), func(c *Context, err error) {
		if err == nil || !strings.Contains(err.Error(), "boom in backward") || !errors.Is(err, rpc.ErrRemote) {
			t.Errorf("Backward: %v; want the remote backward function's error", err)
		}
		if !errors.Is(c.Err(), rpc.ErrRemote) {
			t.Errorf("driver's part: Err() = %v", c.Err())
		}
		if err := partErr(agents[1], c.ID()); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "boom in backward") {
			t.Errorf("worker 1's part: Err() = %v; want ErrAborted naming the cause", err)
		}
		if err := partErr(agents[2], c.ID()); err == nil || !strings.Contains(err.Error(), "boom in backward") {
			t.Errorf("worker 2's part: Err() = %v", err)
		}
	})
	if err == nil {
		t.Fatal("the step succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failing took %v, far less than the timeout expected", d)
	}
	noContexts(t, agents)
}

// A worker that goes away in the middle of the backward pass makes it fail
// on every worker left, with ErrPeerLost (or ErrClosed), well within the
// timeout; the others release the context.
func TestBackwardWorkerLost(t *testing.T) {
	testkit.CheckLeaks(t, testkit.Slack(2))
	started := make(chan struct{}, 1)
	agents := startGroup(t, 3, registerFaulty(func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-started:
			agents[2].Close()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	err := failingStep(t, ctx, agents, withTimeout(20*time.Second), func(c *Context, err error) {
		if !errors.Is(err, rpc.ErrPeerLost) && !errors.Is(err, rpc.ErrClosed) {
			t.Errorf("Backward: %v; want ErrPeerLost or ErrClosed", err)
		}
		if err := partErr(agents[1], c.ID()); !errors.Is(err, ErrAborted) {
			t.Errorf("worker 1's part: Err() = %v; want ErrAborted", err)
		}
	})
	if err == nil {
		t.Fatal("the step succeeded")
	}
	// The release reaches worker 2 either after its agent has stopped
	// (WithContext then reports that it could not release there) or while
	// its shutdown is still answering calls, with its contexts already
	// dropped (nothing is left to release, and the error names worker 2's
	// shutdown instead). Either way the error must say what happened to w2.
	if msg := err.Error(); !strings.Contains(msg, "releasing context") && !strings.Contains(msg, "agent w2 (id 2) is shutting down") {
		t.Errorf("WithContext reported neither that the dead worker could not be released nor that it was shutting down: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failing took %v", d)
	}
	noContexts(t, agents)
}

// A pass that does not finish in time ends with ErrTimeout on every worker.
func TestBackwardTimeout(t *testing.T) {
	testkit.CheckLeaks(t, testkit.Slack(2))
	agents := startGroup(t, 3, registerFaulty(func(ctx context.Context) error {
		<-ctx.Done()
		return context.Cause(ctx)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := failingStep(t, ctx, agents, withTimeout(time.Second), func(c *Context, err error) {
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("Backward: %v; want ErrTimeout", err)
		}
		for w := 1; w <= 2; w++ {
			if err := partErr(agents[w], c.ID()); err == nil {
				t.Errorf("worker %d's part has no error", w)
			}
		}
	})
	if err == nil {
		t.Fatal("the step succeeded")
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("a 1 s backward took %v to fail", d)
	}
	noContexts(t, agents)
}

// A call that failed in the forward pass makes Backward refuse to run.
func TestBackwardAfterForwardFailure(t *testing.T) {
	agents := startGroup(t, 2, registerStage)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stage, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", stageConfig{In: 2, Out: 2, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer stage.Close(ctx)
	x := randDense(rand.New(rand.NewPCG(2, 2)), 1, 2)
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		y, err := stage.Forward(ctx, c, x)
		if err != nil {
			return err
		}
		if _, err := rpc.Sync[*tensor.Dense](ctx, agents[0], "w1", "no.such.function", y); !errors.Is(err, rpc.ErrUnknownFunction) {
			t.Errorf("calling an unknown function: %v", err)
		}
		err = c.Backward(ctx, y)
		if !errors.Is(err, ErrForwardFailed) {
			t.Errorf("Backward after a failed call: %v; want ErrForwardFailed", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)
}
