package commtest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/tandemml/tandem/comm"
	"gorgonia.org/tensor"
)

// sumOfRanks all-reduces each rank's world rank over pg and checks the total.
func sumOfRanks(t *testing.T, pg *comm.ProcessGroup, worldRank int) error {
	ctx := testCtx(t)
	x := newTensor(tensor.Int64, []int{1}, func(int) int64 { return int64(worldRank) })
	if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	want := 0
	for _, r := range pg.Ranks() {
		want += r
	}
	if got := values(x)[0]; got != float64(want) {
		return fmt.Errorf("group %v: sum of world ranks %v, want %d", pg.Ranks(), got, want)
	}
	return nil
}

func (s *suite) testSubgroups(t *testing.T) {
	ctx := testCtx(t)
	n := 5
	pgs := s.world(t, n)
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		sub, err := pg.NewGroup(ctx, []int{3, 1, 4})
		if err != nil {
			return err
		}
		// World and subgroup collectives in flight at once: their tags
		// never mix.
		wx := newTensor(tensor.Float32, []int{6}, func(int) int64 { return 1 })
		ww := pg.AllReduce(ctx, wx, comm.Sum)
		member := slices.Contains([]int{3, 1, 4}, r)
		if sub.IsMember() != member {
			return fmt.Errorf("IsMember = %v", sub.IsMember())
		}
		if !member {
			x := newTensor(tensor.Int64, []int{1}, func(int) int64 { return 1 })
			if err := sub.AllReduce(ctx, x, comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrNotMember) || !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("collective on a non-member handle: got %v, want ErrNotMember", err)
			}
			if sub.Rank() != -1 {
				return fmt.Errorf("non-member Rank() = %d, want -1", sub.Rank())
			}
		} else {
			wantRank := slices.Index([]int{3, 1, 4}, r)
			if sub.Rank() != wantRank || sub.Size() != 3 {
				return fmt.Errorf("subgroup rank %d of %d, want %d of 3", sub.Rank(), sub.Size(), wantRank)
			}
			if wr, err := sub.WorldRank(0); err != nil || wr != 3 {
				return fmt.Errorf("WorldRank(0) = %d, %v; want 3", wr, err)
			}
			if gr, err := sub.GroupRank(4); err != nil || gr != 2 {
				return fmt.Errorf("GroupRank(4) = %d, %v; want 2", gr, err)
			}
			if _, err := sub.GroupRank(0); !errors.Is(err, comm.ErrInvalidArgument) {
				return fmt.Errorf("GroupRank of a non-member: got %v, want ErrInvalidArgument", err)
			}
			if err := sumOfRanks(t, sub, r); err != nil {
				return err
			}
			// Broadcast from group rank 1 (world rank 1).
			b := newTensor(tensor.Int32, []int{2}, func(i int) int64 { return int64(r*10 + i) })
			if err := sub.Broadcast(ctx, b, 1).Wait(ctx); err != nil {
				return err
			}
			if got := values(b); !equal(got, []float64{10, 11}) {
				return fmt.Errorf("subgroup broadcast from group rank 1: got %v", got)
			}
			// A group inside the subgroup (group ranks 0 and 2: world 3 and 4).
			inner, err := sub.NewGroup(ctx, []int{2, 0})
			if err != nil {
				return err
			}
			if inner.IsMember() {
				if !slices.Equal(inner.Ranks(), []int{4, 3}) {
					return fmt.Errorf("inner group ranks %v, want [4 3]", inner.Ranks())
				}
				if err := sumOfRanks(t, inner, r); err != nil {
					return err
				}
			}
		}

		if err := ww.Wait(ctx); err != nil {
			return err
		}
		if got := values(wx)[0]; got != float64(n) {
			return fmt.Errorf("world all-reduce beside the subgroup: got %v", got)
		}

		// Consecutive subgroups (the last rank of 5 is left out by size 2
		// only if it divides; use enumeration for that).
		pairs, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0, 2}, {1, 3}})
		if err != nil {
			return err
		}
		if r == 4 {
			if pairs.IsMember() {
				return fmt.Errorf("rank 4 is in no enumerated group but got a member handle")
			}
		} else if err := sumOfRanks(t, pairs, r); err != nil {
			return err
		}
		whole, err := pg.NewSubgroups(ctx, 5)
		if err != nil {
			return err
		}
		if err := sumOfRanks(t, whole, r); err != nil {
			return err
		}
		if _, err := pg.NewSubgroups(ctx, 2); !errors.Is(err, comm.ErrInvalidArgument) {
			return fmt.Errorf("NewSubgroups(2) of 5 ranks: got %v, want ErrInvalidArgument", err)
		}
		if _, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0, 1}, {1, 2}}); !errors.Is(err, comm.ErrInvalidArgument) {
			return fmt.Errorf("overlapping enumeration: got %v, want ErrInvalidArgument", err)
		}
		// The world still works after the refused constructions.
		return sumOfRanks(t, pg, r)
	})
}

func (s *suite) testSplit(t *testing.T) {
	ctx := testCtx(t)
	n := 5
	pgs := s.world(t, n)
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		// Even and odd ranks, each ordered by descending world rank.
		half, err := pg.Split(ctx, r%2, -r)
		if err != nil {
			return err
		}
		want := []int{4, 2, 0}
		if r%2 == 1 {
			want = []int{3, 1}
		}
		if !slices.Equal(half.Ranks(), want) || half.Rank() != slices.Index(want, r) {
			return fmt.Errorf("split: group %v rank %d, want %v rank %d", half.Ranks(), half.Rank(), want, slices.Index(want, r))
		}
		if err := sumOfRanks(t, half, r); err != nil {
			return err
		}
		// A negative color opts out; split a subgroup further.
		color := 0
		if r == 4 {
			color = -1
		}
		most, err := pg.Split(ctx, color, r)
		if err != nil {
			return err
		}
		if r == 4 {
			if most.IsMember() {
				return fmt.Errorf("negative color got a member handle")
			}
			return nil
		}
		if err := sumOfRanks(t, most, r); err != nil {
			return err
		}
		quarter, err := most.Split(ctx, r/2, 0)
		if err != nil {
			return err
		}
		return sumOfRanks(t, quarter, r)
	})
}
