package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/local"
)

// trainRanks runs the tutorial on world goroutine ranks.
func trainRanks(t *testing.T, world int, c config) ([]*result, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	groups, err := local.NewGroups(ctx, world)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]*result, world)
	errs := make([]error, world)
	outs := make([]bytes.Buffer, world)
	var wg sync.WaitGroup
	for r, pg := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			res[r], errs[r] = train(ctx, pg, c, &outs[r])
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 1; r < world; r++ {
		if outs[r].Len() != 0 {
			t.Errorf("rank %d printed %q; only rank 0 reports", r, outs[r].String())
		}
	}
	return res, outs[0].String()
}

func TestTutorial(t *testing.T) {
	c := defaultConfig()
	start := time.Now()
	_, out := trainRanks(t, 2, c)
	t.Logf("%s\n%v", out, time.Since(start))
}
