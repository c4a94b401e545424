package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// opLog is an Observer that keeps what it is told.
type opLog struct {
	mu  sync.Mutex
	ops []observed
}

type observed struct {
	op  string
	d   time.Duration
	err error
}

func (l *opLog) StoreOp(op string, d time.Duration, err error) {
	l.mu.Lock()
	l.ops = append(l.ops, observed{op, d, err})
	l.mu.Unlock()
}

func (l *opLog) take() []observed {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.ops
	l.ops = nil
	return out
}

// A TCP store client reports every operation it completes, by name, with
// its duration and error; one without an observer reports nothing.
func TestObserverSeesEveryOp(t *testing.T) {
	srv := startServer(t)
	var log opLog
	s := dialT(t, srv.Addr(), WithObserver(&log))
	plain := dialT(t, srv.Addr())
	ctx := ctxFor(t, long)

	noErr(t, s.Set(ctx, "a", []byte("1")))
	must(s.Get(ctx, "a")).get(t)
	must(s.Add(ctx, "n", 2)).get(t)
	must(s.CompareSet(ctx, "a", []byte("1"), []byte("2"))).get(t)
	must(s.Check(ctx, []string{"a"})).get(t)
	must(s.NumKeys(ctx)).get(t)
	noErr(t, s.MultiSet(ctx, []string{"b", "c"}, [][]byte{{1}, {2}}))
	must(s.MultiGet(ctx, []string{"b", "c"})).get(t)
	noErr(t, s.Append(ctx, "b", []byte{3}))
	must(s.DeleteKey(ctx, "c")).get(t)
	// A Wait that another client's Set releases takes at least the pause
	// before it.
	const pause = 50 * time.Millisecond
	go func() {
		time.Sleep(pause)
		plain.Set(context.Background(), "late", []byte("x"))
	}()
	noErr(t, s.Wait(ctx, []string{"late"}, long))
	// A Get that times out is reported with its error.
	if _, err := s.(*TCPStore).Get(ctxFor(t, 20*time.Millisecond), "missing"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get of a missing key: %v, want ErrTimeout", err)
	}

	want := []string{"set", "get", "add", "compare_set", "check", "num_keys", "multi_set", "multi_get", "append", "delete_key", "wait", "get"}
	got := log.take()
	if len(got) != len(want) {
		t.Fatalf("observed %d operations %v, want %d: %v", len(got), got, len(want), want)
	}
	for i, o := range got {
		if o.op != want[i] {
			t.Errorf("operation %d observed as %q, want %q", i, o.op, want[i])
		}
		if o.d <= 0 {
			t.Errorf("operation %d (%s) took %v", i, o.op, o.d)
		}
		failed := i == len(want)-1
		if (o.err != nil) != failed {
			t.Errorf("operation %d (%s) observed with error %v", i, o.op, o.err)
		}
	}
	if w := got[len(want)-2]; w.d < pause {
		t.Errorf("the Wait released after %v was observed taking %v", pause, w.d)
	}
	if e := got[len(want)-1].err; !errors.Is(e, ErrTimeout) {
		t.Errorf("the timed-out Get was observed with %v, want ErrTimeout", e)
	}

	// The other client's Set was not reported to this observer.
	noErr(t, plain.Set(ctx, "z", nil))
	if got := log.take(); len(got) != 0 {
		t.Errorf("a client without the observer reported %v", got)
	}
}
