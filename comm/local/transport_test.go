package local

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/comm/transport/transporttest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTransportContract runs the point-to-point contract on transports
// that meet through a store.
func TestTransportContract(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return transporttest.Connect(t, Backend{}, n, nil)
	})
}

// TestAbortWrapsCause: within one process the peers' ErrPeerLost wraps the
// aborting rank's cause itself, not only its text.
func TestAbortWrapsCause(t *testing.T) {
	ctx := ctxT(t)
	ts, err := NewTransports(3)
	require.NoError(t, err)
	boom := errors.New("boom")
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for _, r := range []int{0, 2} {
		wg.Go(func() { errs[r] = ts[r].Recv(ctx, 1, 1, make([]byte, 1)) })
	}
	time.Sleep(20 * time.Millisecond)
	ts[1].Abort(boom)
	wg.Wait()
	for _, r := range []int{0, 2} {
		assert.ErrorIs(t, errs[r], transport.ErrPeerLost, "rank %d", r)
		assert.ErrorIs(t, errs[r], boom, "rank %d", r)
	}
}

func TestConnectThroughStore(t *testing.T) {
	ctx := ctxT(t)
	ts := transporttest.Connect(t, Backend{}, 3, nil)
	if err := ts[2].Send(ctx, 0, 1, []byte{5}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if err := ts[0].Recv(ctx, 2, 1, b); err != nil || b[0] != 5 {
		t.Fatalf("%v %v", b, err)
	}
	if _, err := (Backend{}).Connect(ctx, transport.Config{Rank: 0, Size: 2}); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("no store: got %v, want ErrInvalidArgument", err)
	}
	worlds.Lock()
	left := len(worlds.m)
	worlds.Unlock()
	if left != 0 {
		t.Errorf("%d worlds left in the registry after every rank joined", left)
	}
}
