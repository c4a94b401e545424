package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Subgroups ride on the world's transport: a subgroup translates its ranks to
// world ranks and puts its own group id into every tag. Group ids are agreed
// when a group is made: the members of the parent group take the largest id
// any of them may propose (an all-reduce), so a new group's id differs from
// every id that any of its members already uses.
//
// Making groups is a collective over the parent group: every member of the
// parent calls the same constructor with the same arguments, in the same order
// relative to its other collectives. A rank that is not in the new group gets
// a handle whose IsMember is false and on which every operation fails with
// ErrNotMember (rather than a nil pointer, so mistakes are reported, not
// panics).

// NewGroup makes a group of the given ranks of pg (ranks of pg, in the order
// that becomes the new group's ranks). Every member of pg must call it with
// the same ranks. opts override the options inherited from pg; the name
// defaults to "group<id>".
func (pg *ProcessGroup) NewGroup(ctx context.Context, ranks []int, opts ...Option) (*ProcessGroup, error) {
	return pg.makeGroups(ctx, "new_group", [][]int{ranks}, opts)
}

// NewSubgroups cuts pg into groups of size consecutive ranks (size must
// divide pg.Size()) and returns the one this rank belongs to.
func (pg *ProcessGroup) NewSubgroups(ctx context.Context, size int, opts ...Option) (*ProcessGroup, error) {
	if size <= 0 || len(pg.members)%size != 0 {
		return nil, errorf(ErrInvalidArgument, "NewSubgroups: size %d does not divide the group size %d", size, len(pg.members))
	}
	groups := make([][]int, 0, len(pg.members)/size)
	for lo := 0; lo < len(pg.members); lo += size {
		g := make([]int, size)
		for i := range g {
			g[i] = lo + i
		}
		groups = append(groups, g)
	}
	return pg.makeGroups(ctx, "new_subgroups", groups, opts)
}

// NewSubgroupsByEnumeration makes one group per entry of groups (disjoint
// lists of ranks of pg) and returns the one this rank belongs to, or a
// non-member handle when it is in none.
func (pg *ProcessGroup) NewSubgroupsByEnumeration(ctx context.Context, groups [][]int, opts ...Option) (*ProcessGroup, error) {
	return pg.makeGroups(ctx, "new_subgroups_by_enumeration", groups, opts)
}

func (pg *ProcessGroup) makeGroups(ctx context.Context, what string, groups [][]int, opts []Option) (*ProcessGroup, error) {
	invalid := pg.checkGroups(groups)
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = shapeString(g)
	}
	desc := fmt.Sprintf("%s(%s)", what, strings.Join(parts, ""))
	var base uint32
	err := pg.start(ctx, collective{name: what, desc: desc, invalid: invalid,
		run: func(ctx context.Context, c *opCtx) error {
			var err error
			base, err = pg.agreeGroupIDs(ctx, c, len(groups))
			return err
		}}).Wait(ctx)
	if err != nil {
		return nil, err
	}
	for i, g := range groups {
		if slices.Contains(g, pg.rank) {
			return pg.subgroup(base+uint32(i), g, opts), nil
		}
	}
	return pg.nonMember(groups, opts), nil
}

func (pg *ProcessGroup) checkGroups(groups [][]int) error {
	seen := map[int]int{}
	for i, g := range groups {
		if len(g) == 0 {
			return errorf(ErrInvalidArgument, "group %d is empty", i)
		}
		for _, r := range g {
			if r < 0 || r >= len(pg.members) {
				return errorf(ErrInvalidArgument, "group %d lists rank %d; the parent group %q has ranks 0..%d", i, r, pg.name, len(pg.members)-1)
			}
			if j, dup := seen[r]; dup {
				if j == i {
					return errorf(ErrInvalidArgument, "group %d lists rank %d twice", i, r)
				}
				return errorf(ErrInvalidArgument, "rank %d is in both group %d and group %d; groups must be disjoint", r, j, i)
			}
			seen[r] = i
		}
	}
	return nil
}

// agreeGroupIDs reserves count consecutive group ids agreed by every member of
// the group running c, and returns the first.
func (pg *ProcessGroup) agreeGroupIDs(ctx context.Context, c *opCtx, count int) (uint32, error) {
	w := pg.world
	w.mu.Lock()
	proposal := int64(w.nextID)
	w.mu.Unlock()
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(proposal))
	if err := allReduceBytes(ctx, c, b, dtInt64, Max); err != nil {
		return 0, err
	}
	return pg.reserveIDs(int64(binary.LittleEndian.Uint64(b)), count)
}

func (pg *ProcessGroup) reserveIDs(base int64, count int) (uint32, error) {
	if base+int64(count)-1 > maxGroupID {
		return 0, errorf(ErrInvalidArgument, "no group ids left: at most %d groups can be made on one world", maxGroupID)
	}
	w := pg.world
	w.mu.Lock()
	w.nextID = max(w.nextID, uint32(base)+uint32(count))
	w.mu.Unlock()
	return uint32(base), nil
}

// subgroup builds this rank's handle on the group of parent ranks g.
func (pg *ProcessGroup) subgroup(id uint32, g []int, opts []Option) *ProcessGroup {
	o := pg.opts
	o.name = ""
	for _, opt := range opts {
		opt(&o)
	}
	if o.name == "" {
		o.name = fmt.Sprintf("group%d", id)
	}
	members := make([]int, len(g))
	rank := -1
	for i, r := range g {
		members[i] = pg.members[r]
		if r == pg.rank {
			rank = i
		}
	}
	return newGroup(pg.world.life, pg.world, id, rank, members, o)
}

// nonMember returns the handle a rank gets for a group it is not in.
func (pg *ProcessGroup) nonMember(groups [][]int, opts []Option) *ProcessGroup {
	var members []int
	if len(groups) == 1 {
		members = groups[0]
	}
	h := pg.subgroup(0, members, opts)
	h.rank = -1
	if h.name == "group0" {
		h.name = "non-member group"
	}
	return h
}

// Split partitions pg by color, as MPI_Comm_split does: ranks that pass the
// same color form a group, ordered by key and then by their rank in pg. Every
// member of pg calls it. A negative color joins no group and gets a
// non-member handle.
func (pg *ProcessGroup) Split(ctx context.Context, color, key int, opts ...Option) (*ProcessGroup, error) {
	n := len(pg.members)
	table := make([]byte, 24*n)
	var base uint32
	var groups [][]int
	err := pg.start(ctx, collective{name: "split", desc: "split()",
		run: func(ctx context.Context, c *opCtx) error {
			w := pg.world
			w.mu.Lock()
			proposal := w.nextID
			w.mu.Unlock()
			mine := table[24*c.rank() : 24*c.rank()+24]
			binary.LittleEndian.PutUint64(mine[0:], uint64(int64(color)))
			binary.LittleEndian.PutUint64(mine[8:], uint64(int64(key)))
			binary.LittleEndian.PutUint64(mine[16:], uint64(proposal))
			if n > 1 {
				if err := ringRun(ctx, c, splitBlocks(table, 24, n), dtInt64, KindSum, n-1, 2*(n-1), nil); err != nil {
					return err
				}
			}
			type entry struct{ color, key, rank int }
			byColor := map[int][]entry{}
			var top uint32
			for r := range n {
				e := table[24*r : 24*r+24]
				col := int(int64(binary.LittleEndian.Uint64(e[0:])))
				top = max(top, uint32(binary.LittleEndian.Uint64(e[16:])))
				if col >= 0 {
					byColor[col] = append(byColor[col], entry{col, int(int64(binary.LittleEndian.Uint64(e[8:]))), r})
				}
			}
			colors := make([]int, 0, len(byColor))
			for col := range byColor {
				colors = append(colors, col)
			}
			sort.Ints(colors)
			for _, col := range colors {
				es := byColor[col]
				sort.Slice(es, func(i, j int) bool {
					if es[i].key != es[j].key {
						return es[i].key < es[j].key
					}
					return es[i].rank < es[j].rank
				})
				g := make([]int, len(es))
				for i, e := range es {
					g[i] = e.rank
				}
				groups = append(groups, g)
			}
			var err error
			base, err = pg.reserveIDs(int64(top), max(1, len(groups)))
			return err
		}}).Wait(ctx)
	if err != nil {
		return nil, err
	}
	for i, g := range groups {
		if slices.Contains(g, pg.rank) {
			return pg.subgroup(base+uint32(i), g, opts), nil
		}
	}
	return pg.nonMember(nil, opts), nil
}
