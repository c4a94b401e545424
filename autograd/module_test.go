package autograd

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// RemoteModule on another worker and on the caller's own worker, a
// constructor's error, and Forward after Close.
func TestRemoteModule(t *testing.T) {
	agents := startGroup(t, 2, func(reg *rpc.Registry) {
		registerStage(reg)
		if err := RegisterModule(reg, "broken.new", func(ctx context.Context, cfg stageConfig) (models.Module, error) {
			return nil, errors.New("no such layer size")
		}); err != nil {
			t.Fatal(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := stageConfig{In: 3, Out: 2, Tanh: true, Seed: 5}
	x := randDense(rand.New(rand.NewPCG(4, 4)), 2, 3)
	local, _ := newStage(cfg)
	want, err := NewModuleFunction("local", local).Apply(ctx, nil, x)
	if err != nil {
		t.Fatal(err)
	}
	for _, worker := range []string{"w1", "w0"} {
		m, err := NewRemoteModule(ctx, agents[0], worker, "stage.new", cfg)
		if err != nil {
			t.Fatalf("on %s: %v", worker, err)
		}
		if m.Worker().Name != worker {
			t.Errorf("Worker() = %v", m.Worker())
		}
		y, err := m.Forward(ctx, nil, x)
		if err != nil {
			t.Fatalf("Forward on %s: %v", worker, err)
		}
		if d := maxAbsDiff(t, y, want[0]); d != 0 {
			t.Errorf("Forward on %s differs from the local module by %g", worker, d)
		}
		if st, err := m.Stats(ctx); err != nil || st.ForwardRuns != 1 || st.BackwardRuns != 0 || st.Forward <= 0 {
			t.Errorf("Stats on %s: %+v, %v; want one forward run", worker, st, err)
		}
		refs, err := m.ParameterRRefs(ctx)
		if err != nil || len(refs) != 2 {
			t.Fatalf("ParameterRRefs on %s: %d, %v", worker, len(refs), err)
		}
		for _, r := range refs {
			r.Release(ctx)
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(ctx, nil, x); err == nil || !strings.Contains(err.Error(), "has no module") {
			t.Errorf("Forward after Close on %s: %v", worker, err)
		}
	}
	if _, err := NewRemoteModule(ctx, agents[0], "w1", "broken.new", cfg); err == nil || !strings.Contains(err.Error(), "no such layer size") {
		t.Errorf("a failing constructor: %v", err)
	}
}
