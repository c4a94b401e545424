package main

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/autograd"
	"github.com/tandemml/tandem/rpc"
)

var small = config{Batch: 24, MicroBatches: 4, In: 6, Hidden: 10, Out: 3, Steps: 2, LR: 0.05, Momentum: 0.9, Seed: 3}

// gradients runs one schedule in a fresh context, without an update, and
// returns the loss and the gradients on both stage workers by name.
func gradients(t *testing.T, ctx context.Context, p *pipeline, agents []*rpc.Agent, pipelined bool) (float64, map[string]*tensor.Dense) {
	t.Helper()
	var loss float64
	out := map[string]*tensor.Dense{}
	err := autograd.WithContext(ctx, p.agent, func(ctx context.Context, c *autograd.Context) error {
		var err error
		if pipelined {
			loss, err = p.pipelined(ctx, c)
		} else {
			loss, err = p.sequential(ctx, c)
		}
		if err != nil {
			return err
		}
		for w := 1; w <= 2; w++ {
			gs, err := autograd.GetGradients(agents[w], c.ID())
			if err != nil {
				return err
			}
			for prm, g := range gs {
				out[workerNames[w]+"/"+prm.Name] = g
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return loss, out
}

// The pipelined schedule computes the same loss and the same gradients as
// running the micro-batches one after another; training lowers the loss.
func TestPipeline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg, err := registry()
	if err != nil {
		t.Fatal(err)
	}
	agents, err := startAgents(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPipeline(ctx, agents[0], small)
	if err != nil {
		t.Fatal(err)
	}
	seqLoss, seq := gradients(t, ctx, p, agents, false)
	pipeLoss, pipe := gradients(t, ctx, p, agents, true)
	if seqLoss != pipeLoss {
		t.Errorf("loss %v sequential, %v pipelined", seqLoss, pipeLoss)
	}
	if len(seq) != 4 || len(pipe) != 4 {
		t.Fatalf("gradients: %d sequential, %d pipelined; want 4 each", len(seq), len(pipe))
	}
	for name, g := range seq {
		a, b := g.Float64s(), pipe[name].Float64s()
		for i := range a {
			if d := math.Abs(a[i] - b[i]); d > 1e-12*math.Max(1, math.Abs(a[i])) {
				t.Fatalf("%s[%d]: %v sequential, %v pipelined", name, i, a[i], b[i])
			}
		}
	}
	if err := p.close(ctx); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	rep, err := train(ctx, agents[0], small, &out)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rep.Losses); n != 1+2*small.Steps || rep.Losses[n-1] >= rep.Losses[0] {
		t.Errorf("losses %v: want %d steps, falling", rep.Losses, 1+2*small.Steps)
	}
	if !strings.Contains(out.String(), "speed-up") || rep.SpeedUp <= 0 {
		t.Errorf("no speed-up reported:\n%s", out.String())
	}
	for _, u := range append(rep.Sequential.Util, rep.Piped.Util...) {
		if u[0] <= 0 || u[0] > 1.05 || u[1] <= 0 || u[1] > 1.05 {
			t.Errorf("stage utilization %v out of (0, 1]", u)
		}
	}
	if err := shutdownAll(ctx, agents); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if n := len(autograd.Contexts(a)); n != 0 {
			t.Errorf("%s holds %d contexts after training", a.Self().Name, n)
		}
	}
}
