package rpc

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// startGroup starts n agents in this process over loopback sockets, meeting
// through an in-memory store. setup (may be nil) registers functions on
// rank r's registry before Init.
func startGroup(t testing.TB, n int, setup func(rank int, reg *Registry), opts ...Option) []*Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := store.NewMemory()
	agents := make([]*Agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		reg := NewRegistry()
		if setup != nil {
			setup(r, reg)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := append([]Option{WithStore(st), WithRegistry(reg), WithListenAddr("127.0.0.1:0")}, opts...)
			agents[r], errs[r] = Init(ctx, fmt.Sprintf("w%d", r), r, n, o...)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Init rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.Shutdown(ctx, false)
			}()
		}
		wg.Wait()
		st.Close()
	})
	return agents
}

// shutdownAll shuts every agent down gracefully, concurrently, and returns
// their errors.
func shutdownAll(agents []*Agent) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.Shutdown(ctx, true)
		}()
	}
	wg.Wait()
	return errs
}

// checkGoroutines fails if the goroutine count does not come back to about
// before within a grace period.
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+2 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after shutdown\n%s", before, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
