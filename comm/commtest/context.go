package commtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// testContextRule checks the context rule that every backend keeps: a
// deadline gives an error wrapping both comm.ErrTimeout and
// context.DeadlineExceeded, a cancellation one wrapping context.Canceled and
// not comm.ErrTimeout, and a nil context is refused with
// comm.ErrInvalidArgument; for messages, collectives and Work.Wait alike.
func (s *suite) testContextRule(t *testing.T) {
	expired := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, comm.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Errorf("%s after a deadline: got %v, want ErrTimeout and context.DeadlineExceeded", what, err)
		}
	}
	cancelled := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) || errors.Is(err, comm.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s after a cancellation: got %v, want context.Canceled and not ErrTimeout", what, err)
		}
	}
	// cancelSoon returns a context cancelled after d.
	cancelSoon := func(t *testing.T, d time.Duration) context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(d, cancel)
		t.Cleanup(func() { timer.Stop(); cancel() })
		return ctx
	}
	short := func(t *testing.T, d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	x := func() *tensor.Dense { return newTensor(tensor.Int32, []int{4}, func(int) int64 { return 1 }) }

	t.Run("point-to-point", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2)
		expired(t, "Recv", pgs[0].Recv(short(t, 100*time.Millisecond), x(), 1, 7))
		cancelled(t, "Recv", pgs[0].Recv(cancelSoon(t, 100*time.Millisecond), x(), 1, 8))
		dead, cancel := context.WithCancel(ctx)
		cancel()
		cancelled(t, "Send with a cancelled context", pgs[0].Send(dead, x(), 1, 9))
		// The group is not broken by a point-to-point message that gave up.
		mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
			if r == 0 {
				return pg.Send(ctx, x(), 1, 10)
			}
			return pg.Recv(ctx, x(), 0, 10)
		})
	})
	t.Run("wait", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2)
		w := pgs[0].AllReduce(ctx, x(), comm.Sum)
		expired(t, "Work.Wait", w.Wait(short(t, 50*time.Millisecond)))
		cancelled(t, "Work.Wait", w.Wait(cancelSoon(t, 50*time.Millisecond)))
		// The operation itself goes on: the peer completes it.
		if err := pgs[1].AllReduce(ctx, x(), comm.Sum).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("collective cancelled", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2)
		// Rank 1 never joins; rank 0 gives up when its context is cancelled.
		cancelled(t, "AllReduce", pgs[0].AllReduce(cancelSoon(t, 150*time.Millisecond), x(), comm.Sum).Wait(ctx))
	})
	t.Run("nil context", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2)
		var none context.Context // a nil context, as a programming error passes it
		if err := pgs[0].AllReduce(none, x(), comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("AllReduce with a nil context: got %v, want ErrInvalidArgument", err)
		}
		if err := pgs[0].Send(none, x(), 1, 1); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("Send with a nil context: got %v, want ErrInvalidArgument", err)
		}
		w := pgs[0].Barrier(ctx)
		if err := w.Wait(none); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("Work.Wait with a nil context: got %v, want ErrInvalidArgument", err)
		}
		// Nothing was issued for the refused calls: the group still works.
		if err := pgs[1].Barrier(ctx).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
