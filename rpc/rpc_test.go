package rpc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

type pair struct {
	Name  string
	Scale float64
	T     *tensor.Dense
	Tags  map[string]int
	Vals  []float32
}

func registerBasics(rank int, reg *Registry) {
	must(Register(reg, "echo", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) { return x, nil }))
	must(Register(reg, "add", func(ctx context.Context, p [2]int) (int, error) { return p[0] + p[1], nil }))
	must(Register(reg, "scale", func(ctx context.Context, p pair) (pair, error) {
		out, err := p.T.MulScalar(p.Scale, true)
		if err != nil {
			return pair{}, err
		}
		p.T = out
		p.Name += "!"
		return p, nil
	}))
	must(Register(reg, "fail", func(ctx context.Context, msg string) (int, error) { return 0, errors.New(msg) }))
	must(Register(reg, "boom", func(ctx context.Context, _ struct{}) (int, error) {
		var m map[string]int
		//lint:ignore SA5000 the handler must panic with a runtime error
		m["x"] = 1 // nil map write: panics
		return 0, nil
	}))
	must(Register(reg, "sleep", func(ctx context.Context, d time.Duration) (string, error) {
		select {
		case <-time.After(d):
			return "slept", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}))
	must(Register(reg, "whoami", func(ctx context.Context, _ struct{}) (string, error) {
		w, _ := CallerFromContext(ctx)
		return AgentFromContext(ctx).Self().Name + "<-" + w.Name + ":" + MetadataFromContext(ctx)["k"], nil
	}))
	must(RegisterAsync(reg, "later", func(ctx context.Context, d time.Duration) *Future[int] {
		f := NewFuture[int]()
		time.AfterFunc(d, func() { f.Complete(42, nil) })
		return f
	}))
	must(Register(reg, "relay", func(ctx context.Context, p [2]int) (int, error) {
		a := AgentFromContext(ctx)
		next := a.Workers()[(a.Self().ID+1)%len(a.Workers())].Name
		return Sync[int](ctx, a, next, "add", p)
	}))
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func TestCallForms(t *testing.T) {
	agents := startGroup(t, 3, registerBasics)
	ctx := context.Background()
	a := agents[0]

	x := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	y, err := Sync[*tensor.Dense](ctx, a, "w1", "echo", x)
	if err != nil {
		t.Fatal(err)
	}
	if !y.Shape().Eq(x.Shape()) || y.Dtype() != tensor.Float32 {
		t.Fatalf("echo: got %v %v", y.Shape(), y.Dtype())
	}
	if got := y.Data().([]float32); got[5] != 6 || got[0] != 1 {
		t.Fatalf("echo data %v", got)
	}

	sum, err := Sync[int](ctx, a, "w2", "add", [2]int{40, 2})
	if err != nil || sum != 42 {
		t.Fatalf("add: %v %v", sum, err)
	}

	p := pair{Name: "p", Scale: 3, T: tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2})), Tags: map[string]int{"a": 1}, Vals: []float32{1.5}}
	q, err := Sync[pair](ctx, a, "w1", "scale", p)
	if err != nil {
		t.Fatal(err)
	}
	if q.Name != "p!" || q.Tags["a"] != 1 || q.Vals[0] != 1.5 || q.T.Data().([]float64)[1] != 6 {
		t.Fatalf("scale: %+v %v", q, q.T)
	}

	// Async: many in flight.
	var futs []*Future[int]
	for i := 0; i < 100; i++ {
		futs = append(futs, Async[int](ctx, a, "w1", "add", [2]int{i, i}))
	}
	for i, f := range futs {
		v, err := f.Wait(ctx)
		if err != nil || v != 2*i {
			t.Fatalf("async %d: %v %v", i, v, err)
		}
	}

	// Then, Done.
	f := Async[int](ctx, a, "w2", "later", 10*time.Millisecond)
	got := make(chan int, 1)
	f.Then(func(v int, err error) { got <- v })
	<-f.Done()
	if v := <-got; v != 42 {
		t.Fatalf("later: %d", v)
	}

	// Self call, metadata, caller identity.
	who, err := Sync[string](ctx, a, "w0", "whoami", struct{}{}, WithMetadata(Metadata{"k": "v"}))
	if err != nil || who != "w0<-w0:v" {
		t.Fatalf("whoami: %q %v", who, err)
	}

	// Nested call from a handler.
	r, err := Sync[int](ctx, a, "w1", "relay", [2]int{1, 2})
	if err != nil || r != 3 {
		t.Fatalf("relay: %v %v", r, err)
	}
	m := a.Metrics()
	if m.CallsDone < 100 || m.Latency.Count < 100 || m.Latency.P50 <= 0 {
		t.Fatalf("metrics: %+v", m)
	}
}

func TestErrors(t *testing.T) {
	agents := startGroup(t, 2, registerBasics)
	ctx := context.Background()
	a := agents[0]

	_, err := Sync[int](ctx, a, "w1", "ad", [2]int{1, 2})
	if !errors.Is(err, ErrUnknownFunction) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown: %v", err)
	}
	for _, want := range []string{`"ad"`, `did you mean "add"`, "echo"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("unknown function error %q lacks %q", err, want)
		}
	}

	_, err = Sync[int](ctx, a, "w1", "add", "not a pair")
	if !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), "[2]int") || !strings.Contains(err.Error(), "string") {
		t.Fatalf("wrong arg type: %v", err)
	}
	_, err = Sync[string](ctx, a, "w1", "add", [2]int{1, 2})
	if !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), "int") {
		t.Fatalf("wrong result type: %v", err)
	}

	_, err = Sync[int](ctx, a, "w1", "fail", "disk on fire")
	var re *RemoteError
	if !errors.Is(err, ErrRemote) || !errors.As(err, &re) || re.Message != "disk on fire" || re.Worker != "w1" {
		t.Fatalf("remote error: %v", err)
	}

	_, err = Sync[int](ctx, a, "w1", "boom", struct{}{})
	if !errors.Is(err, ErrPanic) || !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "nil map") {
		t.Fatalf("panic: %v", err)
	}
	t.Logf("panic error: %v", err)
	if !strings.Contains(err.Error(), "rpc_test.go") {
		t.Errorf("panic error lacks the panicking frame: %v", err)
	}
	// The callee keeps serving.
	if v, err := Sync[int](ctx, a, "w1", "add", [2]int{2, 2}); err != nil || v != 4 {
		t.Fatalf("after panic: %v %v", v, err)
	}

	start := time.Now()
	_, err = Sync[string](ctx, a, "w1", "sleep", time.Minute, WithTimeout(100*time.Millisecond))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("timeout took %v", time.Since(start))
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = Sync[string](cctx, a, "w1", "sleep", time.Minute)
	cancel()
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: %v", err)
	}
	// The callee's handler saw its context cancelled: nothing in flight there.
	deadline := time.Now().Add(5 * time.Second)
	for agents[1].Metrics().RequestsInFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("callee still serving cancelled calls: %+v", agents[1].Metrics())
		}
		time.Sleep(10 * time.Millisecond)
	}

	_, err = Sync[int](ctx, a, "nobody", "add", [2]int{1, 2})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("unknown worker: %v", err)
	}
}

func TestGracefulShutdownWaitsForOutstandingCalls(t *testing.T) {
	agents := startGroup(t, 3, registerBasics)
	ctx := context.Background()
	// w0 starts a slow call on w2, then everyone shuts down at once: the call
	// must complete rather than fail.
	f := Async[string](ctx, agents[0], "w2", "sleep", 300*time.Millisecond)
	errs := shutdownAll(agents)
	for i, err := range errs {
		if err != nil {
			t.Errorf("shutdown %d: %v", i, err)
		}
	}
	if v, err := f.Wait(ctx); err != nil || v != "slept" {
		t.Fatalf("outstanding call: %q %v", v, err)
	}
	if _, err := Sync[int](ctx, agents[0], "w1", "add", [2]int{1, 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after shutdown: %v", err)
	}
}
