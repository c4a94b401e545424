package main

import (
	"context"
	"testing"
	"time"
)

func TestParameterServerTrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := config{trainers: 2, steps: 60, batch: 16, lr: 0.05}
	// The loss before training: the model starts at zero.
	data := makeShard(1, 16)
	before, _ := data.lossAndGrads(newParameterServer(cfg.lr).Get(), 0, 16)
	losses, err := runGoroutines(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) != 2 {
		t.Fatalf("losses %v", losses)
	}
	for i, l := range losses {
		if !(l < before/100) {
			t.Errorf("trainer %d: loss %.5f after training, %.5f before", i+1, l, before)
		}
	}
}
