package graph

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/testkit"
)

// chainGraph builds x -> first -> second -> ... -> last (each a probe op).
func chainGraph(t *testing.T, ops ...G.Op) (*G.ExprGraph, []*G.Node) {
	t.Helper()
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 2), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))))
	nodes := []*G.Node{x}
	for i, op := range ops {
		n, err := G.ApplyOp(op, nodes[len(nodes)-1])
		G.WithName(fmt.Sprintf("step%d", i))(G.Must(n, err))
		nodes = append(nodes, n)
	}
	return g, nodes
}

var errOp = errors.New("op failed on purpose")

// An op's error stops the run, names the node and op, and leaves the program
// usable: the next run (with the op fixed) succeeds.
func TestOpErrorNamesNodeAndProgramIsReusable(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			before := runtime.NumGoroutine()
			var failing atomic.Bool
			failing.Store(true)
			var after atomic.Int32
			bad := &probeOp{name: "bad", do: func(context.Context) error {
				if failing.Load() {
					return errOp
				}
				return nil
			}}
			counter := &probeOp{name: "after", do: func(context.Context) error { after.Add(1); return nil }}
			g, nodes := chainGraph(t, &probeOp{name: "ok"}, bad, counter)
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			err = prog.Run(context.Background())
			if !errors.Is(err, errOp) {
				t.Fatalf("got %v, want the op's error", err)
			}
			if want := `graph: node "step1" (probe:bad)`; !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not name the node: want %q in it", err, want)
			}
			if after.Load() != 0 {
				t.Fatal("a node after the failed one ran")
			}
			failing.Store(false)
			if err := prog.Run(context.Background()); err != nil {
				t.Fatalf("second run: %v", err)
			}
			if after.Load() != 1 || nodes[3].Value() == nil {
				t.Fatal("second run did not reach the last node")
			}
			testkit.RequireNoLeak(t, before)
		})
	}
}

// A panic inside an op becomes a *PanicError naming the node.
func TestOpPanicBecomesError(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			boom := &probeOp{name: "boom", do: func(context.Context) error { panic("kaboom") }}
			g, _ := chainGraph(t, &probeOp{name: "ok"}, boom)
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			err = prog.Run(context.Background())
			var pe *PanicError
			if !errors.Is(err, ErrPanic) || !errors.As(err, &pe) {
				t.Fatalf("got %v, want a PanicError", err)
			}
			if pe.Value != "kaboom" || len(pe.Stack) == 0 || !strings.Contains(err.Error(), `"step1" (probe:boom)`) {
				t.Fatalf("panic error %q (value %v) lacks the panic value, stack or node", err, pe.Value)
			}
		})
	}
}

// Cancelling the context while an op blocks on it (as a collective would) makes
// Run return promptly, starts no further node and leaks no goroutine.
func TestCancelStopsRunPromptly(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			before := runtime.NumGoroutine()
			started := make(chan struct{}, 1)
			block := &ctxProbeOp{probeOp: probeOp{name: "block", do: func(ctx context.Context) error {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			}}}
			var after atomic.Int32
			counter := &probeOp{name: "after", do: func(context.Context) error { after.Add(1); return nil }}
			g, _ := chainGraph(t, block, counter)
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- prog.Run(ctx) }()
			<-started
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("got %v, want context.Canceled", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after its context was cancelled")
			}
			if after.Load() != 0 {
				t.Fatal("a node after the cancelled one ran")
			}
			testkit.RequireNoLeak(t, before)
		})
	}
}

// An op that does not look at the context still stops the run at the next
// node once ctx is cancelled; an expired deadline wraps Tandem's timeout.
func TestDeadlineStopsSchedulingAndWrapsTimeout(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			release := make(chan struct{})
			started := make(chan struct{}, 1)
			slow := &probeOp{name: "slow", do: func(context.Context) error {
				started <- struct{}{}
				<-release
				return nil
			}}
			var after atomic.Int32
			counter := &probeOp{name: "after", do: func(context.Context) error { after.Add(1); return nil }}
			g, _ := chainGraph(t, slow, counter)
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
			defer dcancel()
			if err := prog.Run(dctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errs.Timeout) {
				t.Fatalf("expired context: got %v, want DeadlineExceeded and errs.Timeout", err)
			}
			rctx, rcancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- prog.Run(rctx) }()
			<-started
			rcancel()
			close(release)
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
			if after.Load() != 0 {
				t.Fatal("a node ran after the context was cancelled")
			}
		})
	}
}

func TestInputErrors(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 2), G.WithName("x"))
	y := G.Must(G.Tanh(x))
	prog, err := Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := prog.Run(context.Background()); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("unbound input: got %v", err)
	}
	if err := prog.Run(context.Background(), Bind(y, tensor.New(tensor.WithShape(2, 2), tensor.Of(tensor.Float64)))); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("binding a computed node: got %v", err)
	}
	if err := prog.Run(context.Background(), Bind(x, tensor.New(tensor.WithShape(3, 2), tensor.Of(tensor.Float64)))); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("binding a wrong shape: got %v", err)
	}
	v := tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{0, 0, 0, 0}))
	if err := prog.Run(context.Background(), Values{x: v}); err != nil {
		t.Fatal(err)
	}
	if got := y.Value().Data().([]float64); got[0] != 0 {
		t.Fatalf("tanh(0) = %v", got[0])
	}
	if _, err := Compile(g, Workers(0)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Workers(0): got %v", err)
	}
	if _, err := Compile(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil graph: got %v", err)
	}
}
