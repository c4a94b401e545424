package shm_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"gorgonia.org/tensor"
)

// TestInitByName: comm.Init picks the backend by its registered name, and
// the group it builds runs over shared memory.
func TestInitByName(t *testing.T) {
	const n = 3
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pgs := make([]*comm.ProcessGroup, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pgs[r], errs[r] = comm.Init(ctx, "env://", comm.WithStore(st), comm.WithRank(r), comm.WithWorldSize(n),
				comm.WithBackend("shm"), comm.WithoutDefault())
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer pgs[r].Close()
	}
	if b, err := comm.Lookup("shm"); err != nil {
		t.Fatal(err)
	} else if _, ok := b.(shm.Backend); !ok {
		t.Fatalf("backend \"shm\" is a %T", b)
	}
	// The ranks met through the segment that rank 0 published.
	if ok, err := st.Check(ctx, []string{"tandem/shm/segment"}); err != nil || !ok {
		t.Fatalf("no segment name in the store (%v, %v): the ranks did not connect over shm", ok, err)
	}
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := tensor.New(tensor.WithShape(1<<20), tensor.Of(tensor.Float32))
			for i := range x.Data().([]float32) {
				x.Data().([]float32)[i] = float32(r + 1)
			}
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				t.Errorf("rank %d: %v", r, err)
				return
			}
			for i, v := range x.Data().([]float32) {
				if v != n*(n+1)/2 {
					t.Errorf("rank %d: element %d is %v, want %d", r, i, v, n*(n+1)/2)
					return
				}
			}
		}()
	}
	wg.Wait()
}
