package commtest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tandemml/tandem/comm"
	"gorgonia.org/tensor"
)

func (s *suite) testPointToPoint(t *testing.T) {
	ctx := testCtx(t)
	n := 4
	pgs := s.world(t, n)
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		right, left := (r+1)%n, (r+n-1)%n
		// A batch that sends right and receives from the left on every rank.
		out := newTensor(tensor.Float64, []int{3}, func(i int) int64 { return val(r, i) })
		in := zeros(tensor.Float64, []int{3})
		if err := pg.BatchISendIRecv(ctx, []comm.P2POp{comm.RecvOp(in, left, 5), comm.SendOp(out, right, 5)}).Wait(ctx); err != nil {
			return err
		}
		if got, want := values(in), castAll(tensor.Float64, inputsOf(n, 0, 3)[left]); !equal(got, want) {
			return fmt.Errorf("batch: got %v from rank %d, want %v", got, left, want)
		}

		// Messages under one tag arrive in order, even when issued without
		// waiting; different tags are independent streams.
		const k = 10
		var works []comm.Work
		for i := range k {
			works = append(works, pg.ISend(ctx, newTensor(tensor.Int32, []int{1}, func(int) int64 { return int64(i) }), right, 1))
			works = append(works, pg.ISend(ctx, newTensor(tensor.Int32, []int{1}, func(int) int64 { return int64(100 + i) }), right, 2))
		}
		got2 := make([]*tensor.Dense, k)
		for i := range k { // tag 2 first: tag 1's messages wait in the buffer
			got2[i] = zeros(tensor.Int32, []int{1})
			works = append(works, pg.IRecv(ctx, got2[i], left, 2))
		}
		got1 := make([]*tensor.Dense, k)
		for i := range k {
			got1[i] = zeros(tensor.Int32, []int{1})
			if err := pg.Recv(ctx, got1[i], left, 1); err != nil {
				return err
			}
		}
		for _, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		for i := range k {
			if v := values(got1[i])[0]; v != float64(i) {
				return fmt.Errorf("tag 1 message %d: got %v", i, v)
			}
			if v := values(got2[i])[0]; v != float64(100+i) {
				return fmt.Errorf("tag 2 message %d: got %v", i, v)
			}
		}

		// Sending to oneself.
		self := zeros(tensor.Uint8, []int{2})
		w := pg.IRecv(ctx, self, r, 3)
		if err := pg.Send(ctx, newTensor(tensor.Uint8, []int{2}, func(i int) int64 { return int64(i + 1) }), r, 3); err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if got := values(self); !equal(got, []float64{1, 2}) {
			return fmt.Errorf("self send: got %v", got)
		}

		// A size disagreement is an error, not a hang or a short read.
		go func() { _ = pg.Send(ctx, zeros(tensor.Int64, []int{3}), right, 4) }()
		if err := pg.Recv(ctx, zeros(tensor.Int64, []int{2}), left, 4); !errors.Is(err, comm.ErrMismatch) {
			return fmt.Errorf("receiving 3 elements into 2: got %v, want ErrMismatch", err)
		}

		for _, bad := range []error{
			pg.Send(ctx, out, n, 0),
			pg.Send(ctx, out, right, -1),
			pg.Recv(ctx, nil, left, 0),
		} {
			if !errors.Is(bad, comm.ErrInvalidArgument) {
				return fmt.Errorf("invalid point-to-point call: got %v, want ErrInvalidArgument", bad)
			}
		}
		return nil
	})
}
