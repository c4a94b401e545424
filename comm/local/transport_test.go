package local

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestBufferingAndOrder(t *testing.T) {
	ctx := ctxT(t)
	ts, err := NewTransports(2)
	if err != nil {
		t.Fatal(err)
	}
	// Messages sent before any receive is posted wait, in order, per tag.
	for i := range 5 {
		if err := ts[0].Send(ctx, 1, 7, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if err := ts[0].Send(ctx, 1, 8, []byte{byte(10 + i), 0}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		b := make([]byte, 2)
		if err := ts[1].Recv(ctx, 0, 8, b); err != nil || b[0] != byte(10+i) {
			t.Fatalf("tag 8 message %d: %v %v", i, b, err)
		}
	}
	for i := range 5 {
		b := make([]byte, 1)
		if err := ts[1].Recv(ctx, 0, 7, b); err != nil || b[0] != byte(i) {
			t.Fatalf("tag 7 message %d: %v %v", i, b, err)
		}
	}
	// A receive posted first gets the message straight into its buffer; the
	// sender's buffer is free once Send returns.
	got := make(chan []byte)
	go func() {
		b := make([]byte, 3)
		if err := ts[0].Recv(ctx, 1, 1, b); err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(10 * time.Millisecond)
	msg := []byte{1, 2, 3}
	if err := ts[1].Send(ctx, 0, 1, msg); err != nil {
		t.Fatal(err)
	}
	msg[0] = 9
	if b := <-got; b[0] != 1 || b[2] != 3 {
		t.Fatalf("got %v", b)
	}
	// Empty messages and self-sends work.
	if err := ts[0].Send(ctx, 0, 2, nil); err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Recv(ctx, 0, 2, nil); err != nil {
		t.Fatal(err)
	}
}

func TestLengthMismatch(t *testing.T) {
	ctx := ctxT(t)
	ts, _ := NewTransports(2)
	_ = ts[0].Send(ctx, 1, 3, make([]byte, 4))
	if err := ts[1].Recv(ctx, 0, 3, make([]byte, 8)); !errors.Is(err, transport.ErrMismatch) {
		t.Fatalf("got %v, want ErrMismatch", err)
	}
}

func TestRecvContext(t *testing.T) {
	ctx := ctxT(t)
	ts, _ := NewTransports(2)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	b := make([]byte, 1)
	if err := ts[1].Recv(short, 0, 1, b); !errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrTimeout wrapping DeadlineExceeded", err)
	}
	// The withdrawn receive must not take (or write) the next message.
	_ = ts[0].Send(ctx, 1, 1, []byte{42})
	if b[0] != 0 {
		t.Fatal("a withdrawn receive's buffer was written")
	}
	c := make([]byte, 1)
	if err := ts[1].Recv(ctx, 0, 1, c); err != nil || c[0] != 42 {
		t.Fatalf("got %v %v", c, err)
	}
}

func TestAbortAndClose(t *testing.T) {
	ctx := ctxT(t)
	ts, _ := NewTransports(3)
	boom := errors.New("boom")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for _, r := range []int{1, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = ts[r].Recv(ctx, 0, 1, make([]byte, 1))
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[0] = ts[0].Recv(ctx, 1, 9, make([]byte, 1))
	}()
	time.Sleep(20 * time.Millisecond)
	ts[0].Abort(boom)
	wg.Wait()
	if !errors.Is(errs[0], boom) {
		t.Errorf("the aborting rank's pending receive: got %v, want the cause", errs[0])
	}
	for _, r := range []int{1, 2} {
		if !errors.Is(errs[r], transport.ErrPeerLost) || !errors.Is(errs[r], boom) {
			t.Errorf("rank %d: got %v, want ErrPeerLost wrapping the cause", r, errs[r])
		}
	}
	if err := ts[1].Send(ctx, 0, 1, []byte{1}); !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("send to an aborted rank: got %v, want ErrPeerLost", err)
	}
	if err := ts[0].Send(ctx, 1, 1, []byte{1}); !errors.Is(err, boom) {
		t.Errorf("send from an aborted rank: got %v, want the cause", err)
	}

	// Close: messages already sent can still be received; then ErrPeerLost.
	_ = ts[2].Send(ctx, 1, 5, []byte{7})
	pending := make(chan error, 1)
	go func() { pending <- ts[2].Recv(ctx, 1, 6, make([]byte, 1)) }()
	time.Sleep(20 * time.Millisecond)
	if err := ts[2].Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-pending; !errors.Is(err, transport.ErrClosed) {
		t.Errorf("pending receive on Close: got %v, want ErrClosed", err)
	}
	b := make([]byte, 1)
	if err := ts[1].Recv(ctx, 2, 5, b); err != nil || b[0] != 7 {
		t.Errorf("draining a closed peer's message: %v %v", b, err)
	}
	if err := ts[1].Recv(ctx, 2, 5, b); !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("receive from a closed peer: got %v, want ErrPeerLost", err)
	}
}

func TestConnectThroughStore(t *testing.T) {
	ctx := ctxT(t)
	st := store.NewMemory()
	defer st.Close()
	const n = 3
	ts := make([]transport.Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts[r], errs[r] = Backend{}.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
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
