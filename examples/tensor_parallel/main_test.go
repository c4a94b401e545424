package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestTutorial trains the tensor-parallel MLP with goroutine ranks and checks
// that every rank's shard ends where single-process training ends and that
// the loss went down.
func TestTutorial(t *testing.T) {
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprintf("world%d", world), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := config{in: 4, hidden: 8, out: 2, batch: 16, steps: 12, lr: 0.2, seed: 7}
			var out bytes.Buffer
			if err := goroutines(ctx, cfg, world, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			text := out.String()
			for r := 0; r < world; r++ {
				if want := fmt.Sprintf("rank %d: shard matches single-process training", r); !strings.Contains(text, want) {
					t.Errorf("output lacks %q:\n%s", want, text)
				}
			}
			var first, last, ref float64
			lines := strings.Split(strings.TrimSpace(text), "\n")
			if _, err := fmt.Sscanf(lines[0], "step %d  loss %f  (single process %f)", new(int), &first, &ref); err != nil {
				t.Fatalf("first line %q: %v", lines[0], err)
			}
			for _, l := range lines {
				if strings.HasPrefix(l, "step") {
					fmt.Sscanf(l, "step %d  loss %f", new(int), &last)
				}
			}
			if !(last < first/2) {
				t.Errorf("loss went from %v to %v; training should at least halve it", first, last)
			}
		})
	}
}

// TestUnevenSplit: a hidden layer that does not split over the ranks is
// refused before anything runs.
func TestUnevenSplit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := config{in: 4, hidden: 6, out: 2, batch: 4, steps: 1, lr: 0.1, seed: 1}
	err := goroutines(ctx, cfg, 4, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "does not split over 4 ranks") {
		t.Fatalf("hidden 6 over 4 ranks: %v, want a refusal", err)
	}
}
