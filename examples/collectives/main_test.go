package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/local"
)

// TestDemo runs the tutorial with three goroutine ranks and checks what each
// rank prints.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := local.NewGroups(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]bytes.Buffer, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, pg := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			errs[r] = demo(ctx, pg, &outs[r])
		}()
	}
	wg.Wait()
	for r := range groups {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		got := outs[r].String()
		for _, want := range []string{
			"all_reduce(sum)  -> [6 60]",
			"broadcast(0)     -> [3 1 4]",
			"all_gather       -> [0 1 4]",
			"all_reduce(max)  -> [1]",
			"mismatch caught",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("rank %d output lacks %q:\n%s", r, want, got)
			}
		}
	}
}
