package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

// TestInterceptors checks the extension point distributed autograd uses:
// a client interceptor adds metadata and sees the reply's metadata and the
// decoded result; a server interceptor sees the decoded argument and the
// request's metadata and sets reply metadata.
func TestInterceptors(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	client := func(ctx context.Context, c *ClientCall, next Invoker) *Future[*Response] {
		if c.Meta == nil {
			c.Meta = Metadata{}
		}
		c.Meta["ctx-id"] = "41"
		return Then(next(ctx, c), func(r *Response, err error) (*Response, error) {
			if err == nil {
				mu.Lock()
				seen = append(seen, "client:"+c.Function+":"+r.Meta["recv-id"])
				if x, ok := r.Value.(*tensor.Dense); ok {
					seen = append(seen, "client-result-tensor:"+fmt.Sprint(x.Shape()))
				}
				mu.Unlock()
			}
			return r, err
		})
	}
	server := func(ctx context.Context, c *ServerCall, next Handler) *Future[any] {
		mu.Lock()
		seen = append(seen, "server:"+c.Function+":"+c.Meta["ctx-id"]+":"+c.From.Name)
		if x, ok := c.Arg.(*tensor.Dense); ok {
			seen = append(seen, "server-arg-tensor:"+fmt.Sprint(x.Shape()))
		}
		mu.Unlock()
		c.ReplyMeta = Metadata{"recv-id": "7"}
		return next(ctx, c)
	}
	agents := startGroup(t, 2, registerBasics, WithClientInterceptor(client), WithServerInterceptor(server))
	x := dense([]int{2, 2}, []float32{1, 2, 3, 4})
	if _, err := Sync[*tensor.Dense](context.Background(), agents[0], "w1", "echo", x); err != nil {
		t.Fatal(err)
	}
	want := []string{"server:echo:41:w0", "server-arg-tensor:(2, 2)", "client:echo:7", "client-result-tensor:(2, 2)"}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(want) {
		t.Fatalf("seen %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("seen %q, want %q", seen, want)
		}
	}
}

func TestServerInterceptorCanRefuse(t *testing.T) {
	agents := startGroup(t, 2, registerBasics)
	agents[1].UseServer(func(ctx context.Context, c *ServerCall, next Handler) *Future[any] {
		if c.Function == "add" {
			return Ready[any](nil, errors.New("add is disabled here"))
		}
		return next(ctx, c)
	})
	if _, err := Sync[int](context.Background(), agents[0], "w1", "add", [2]int{1, 2}); !errors.Is(err, ErrRemote) {
		t.Fatalf("refused call: %v", err)
	}
	if _, err := Sync[*tensor.Dense](context.Background(), agents[0], "w1", "echo", dense([]int{1}, []float32{1})); err != nil {
		t.Fatal(err)
	}
}

func TestCancelReachesHandler(t *testing.T) {
	started := make(chan struct{}, 1)
	cancelled := make(chan struct{}, 1)
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		must(Register(reg, "wait", func(ctx context.Context, _ struct{}) (int, error) {
			started <- struct{}{}
			<-ctx.Done()
			cancelled <- struct{}{}
			return 0, ctx.Err()
		}))
	})
	ctx, cancel := context.WithCancel(context.Background())
	f := Async[int](ctx, agents[0], "w1", "wait", struct{}{}, WithTimeout(time.Hour))
	<-started
	cancel()
	if _, err := f.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the callee's handler did not see the cancellation")
	}
}

func TestImmediateShutdown(t *testing.T) {
	agents := startGroup(t, 2, registerBasics)
	ctx := context.Background()
	f := Async[string](ctx, agents[0], "w1", "sleep", time.Minute)
	g := Async[string](ctx, agents[1], "w0", "sleep", time.Minute)
	time.Sleep(20 * time.Millisecond)
	if err := agents[0].Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Wait(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("own call at immediate shutdown: %v", err)
	}
	if _, err := g.Wait(ctx); !errors.Is(err, ErrPeerLost) {
		t.Fatalf("peer's call at immediate shutdown: %v", err)
	}
	if err := agents[0].Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second shutdown: %v", err)
	}
}

func TestWorkerInfo(t *testing.T) {
	agents := startGroup(t, 3, nil)
	a := agents[1]
	if a.Self() != (WorkerInfo{Name: "w1", ID: 1}) {
		t.Fatalf("self %v", a.Self())
	}
	if w, err := a.WorkerInfo("w2"); err != nil || w.ID != 2 {
		t.Fatalf("WorkerInfo: %v %v", w, err)
	}
	if w, err := a.WorkerByID(0); err != nil || w.Name != "w0" {
		t.Fatalf("WorkerByID: %v %v", w, err)
	}
	if _, err := a.WorkerByID(3); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad id: %v", err)
	}
	if _, err := a.WorkerInfo("w3"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if ws := a.Workers(); len(ws) != 3 || ws[2].Name != "w2" {
		t.Fatalf("workers %v", ws)
	}
}
