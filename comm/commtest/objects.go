package commtest

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tandemml/tandem/comm"
)

type record struct {
	Name  string
	Vals  []int
	Score map[string]float64
	Any   any
}

func (s *suite) testObjects(t *testing.T) {
	ctx := testCtx(t)
	n := 3
	pgs := s.world(t, n, comm.WithMaxObjectSize(512))
	mine := func(r int) record {
		return record{Name: fmt.Sprintf("rank%d", r), Vals: []int{r, r * r}, Score: map[string]float64{"x": float64(r) / 2}, Any: r}
	}
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		v := record{}
		if r == 1 {
			v = mine(1)
		}
		if err := comm.BroadcastObject(ctx, pg, &v, 1); err != nil {
			return err
		}
		if !reflect.DeepEqual(v, mine(1)) {
			return fmt.Errorf("broadcast_object: got %+v", v)
		}
		all, err := comm.AllGatherObject(ctx, pg, mine(r))
		if err != nil {
			return err
		}
		for i, got := range all {
			if !reflect.DeepEqual(got, mine(i)) {
				return fmt.Errorf("all_gather_object[%d]: got %+v", i, got)
			}
		}
		gathered, err := comm.GatherObject(ctx, pg, fmt.Sprint("hello from ", r), 2)
		if err != nil {
			return err
		}
		if r != 2 && gathered != nil {
			return fmt.Errorf("gather_object on a non-root returned %v", gathered)
		}
		if r == 2 {
			for i, g := range gathered {
				if g != fmt.Sprint("hello from ", i) {
					return fmt.Errorf("gather_object[%d] = %q", i, g)
				}
			}
		}
		var ins []int
		if r == 0 {
			ins = []int{10, 11, 12}
		}
		var got int
		if err := comm.ScatterObject(ctx, pg, &got, ins, 0); err != nil {
			return err
		}
		if got != 10+r {
			return fmt.Errorf("scatter_object: got %d, want %d", got, 10+r)
		}

		// A value that gob cannot encode fails on every rank, naming it.
		bad := mine(r)
		if r == 1 {
			bad.Any = func() {}
		}
		_, err = comm.AllGatherObject(ctx, pg, bad)
		if !errors.Is(err, comm.ErrInvalidArgument) || (r != 1 && !strings.Contains(err.Error(), "rank 1")) {
			return fmt.Errorf("all_gather_object with an unencodable value on rank 1: got %v", err)
		}
		v = record{Any: make(chan int)}
		if err := comm.BroadcastObject(ctx, pg, &v, 0); !errors.Is(err, comm.ErrInvalidArgument) {
			return fmt.Errorf("broadcast_object of an unencodable value: got %v", err)
		}

		// A value over the size limit fails on every rank with ErrTooLarge.
		big := strings.Repeat("x", 1000)
		s := "small"
		if r == 2 {
			s = big
		}
		if err := comm.BroadcastObject(ctx, pg, &s, 2); !errors.Is(err, comm.ErrTooLarge) {
			return fmt.Errorf("broadcast_object over the limit: got %v", err)
		}
		if _, err := comm.GatherObject(ctx, pg, s, 0); !errors.Is(err, comm.ErrTooLarge) {
			return fmt.Errorf("gather_object over the limit: got %v", err)
		}
		var out string
		var outs []string
		if r == 1 {
			outs = []string{"a", big, "c"}
		}
		if err := comm.ScatterObject(ctx, pg, &out, outs, 1); !errors.Is(err, comm.ErrTooLarge) {
			return fmt.Errorf("scatter_object over the limit: got %v", err)
		}

		// Everything still matches up afterwards.
		all2, err := comm.AllGatherObject(ctx, pg, r*r)
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(all2, []int{0, 1, 4}) {
			return fmt.Errorf("all_gather_object after failures: %v", all2)
		}
		return nil
	})
}
