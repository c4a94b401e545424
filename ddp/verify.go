package ddp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

// replicaSig is what every rank tells the others at construction: its model's
// state entries and the options that must agree, or the error that stops it.
type replicaSig struct {
	Entries []entrySig
	Options string
	Err     string
	// Graph describes a user's graph (NewGraph), one line per node in
	// execution order; empty for a models.Module.
	Graph []string
}

type entrySig struct {
	Kind         string // "parameter" or "buffer"
	Name         string
	Dtype        string
	Shape        []int
	RequiresGrad bool
}

func (e entrySig) String() string {
	s := fmt.Sprintf("%s %s %s %v", e.Kind, e.Name, e.Dtype, e.Shape)
	if e.Kind == "parameter" && !e.RequiresGrad {
		s += " (frozen)"
	}
	return s
}

func sigOf(kind string, p *models.Param) entrySig {
	e := entrySig{Kind: kind, Name: p.Name, RequiresGrad: p.RequiresGrad}
	if p.Value != nil {
		e.Dtype = p.Value.Dtype().String()
		e.Shape = slices.Clone([]int(p.Value.Shape()))
	}
	return e
}

// optionsSig describes the options that every rank must share for their
// collectives to match.
func (c *config) optionsSig() string {
	l := c.bucketLimits()
	return fmt.Sprintf("first bucket cap %d B, bucket cap %d B, find_unused_parameters %v, static_graph %v, broadcast_buffers %v, comm hook %s",
		l[0], l[1], c.findUnused, c.staticGraph, c.syncBuffers, c.hookName)
}

// verifyReplicas gathers every rank's signature and fails, on every rank
// alike, when one rank reported an error or differs from rank 0: the error
// names the first difference and the two ranks.
func verifyReplicas(ctx context.Context, pg *comm.ProcessGroup, mine replicaSig) error {
	all, err := comm.AllGatherObject(ctx, pg, mine)
	if err != nil {
		return fmt.Errorf("ddp: exchanging parameter lists: %w", err)
	}
	for r, s := range all {
		if s.Err != "" {
			if r == pg.Rank() {
				return fmt.Errorf("ddp: %s", s.Err) // the local error, returned by the caller with its sentinel
			}
			return fmt.Errorf("ddp: rank %d could not set up its model: %s: %w", r, s.Err, ErrInvalidArgument)
		}
	}
	ref := all[0]
	for r := 1; r < len(all); r++ {
		s := all[r]
		if s.Options != ref.Options {
			return fmt.Errorf("ddp: options differ across ranks: rank 0 has %s; rank %d has %s: every rank must pass the same options: %w", ref.Options, r, s.Options, ErrMismatch)
		}
		n := max(len(ref.Entries), len(s.Entries))
		for i := 0; i < n; i++ {
			var a, b string
			if i < len(ref.Entries) {
				a = ref.Entries[i].String()
			}
			if i < len(s.Entries) {
				b = s.Entries[i].String()
			}
			if a == b {
				continue
			}
			if a == "" {
				a = "nothing"
			}
			if b == "" {
				b = "nothing"
			}
			return fmt.Errorf("ddp: models differ across ranks: entry %d of the state is %s on rank 0 but %s on rank %d (rank 0 has %d parameters and buffers, rank %d has %d): every rank must build the same model: %w",
				i, a, b, r, len(ref.Entries), r, len(s.Entries), ErrMismatch)
		}
		if err := sameGraph(ref.Graph, s.Graph, r); err != nil {
			return err
		}
	}
	return nil
}

// broadcastTensors copies root's tensors into every rank's, in place,
// coalescing tensors of one dtype into few collectives.
func broadcastTensors(ctx context.Context, pg *comm.ProcessGroup, ts []*tensor.Dense, root int) error {
	if pg.Size() == 1 || len(ts) == 0 {
		return nil
	}
	const chunk = 64 << 20 // bytes per collective
	byDtype := map[tensor.Dtype][]*tensor.Dense{}
	var dts []tensor.Dtype
	for _, t := range ts {
		if _, ok := byDtype[t.Dtype()]; !ok {
			dts = append(dts, t.Dtype())
		}
		byDtype[t.Dtype()] = append(byDtype[t.Dtype()], t)
	}
	for _, dt := range dts {
		group := byDtype[dt]
		for len(group) > 0 {
			n, bytes := 0, 0
			for n < len(group) && (n == 0 || bytes+group[n].Shape().TotalSize()*int(dt.Size()) <= chunk) {
				bytes += group[n].Shape().TotalSize() * int(dt.Size())
				n++
			}
			if err := broadcastFlat(ctx, pg, group[:n], root); err != nil {
				return err
			}
			group = group[n:]
		}
	}
	return nil
}

// broadcastFlat broadcasts tensors of one dtype as one flat buffer.
func broadcastFlat(ctx context.Context, pg *comm.ProcessGroup, ts []*tensor.Dense, root int) error {
	if len(ts) == 1 && !ts[0].IsScalar() && !ts[0].RequiresIterator() {
		return pg.Broadcast(ctx, ts[0], root).Wait(ctx)
	}
	total := 0
	for _, t := range ts {
		total += t.Shape().TotalSize()
	}
	flat := tensor.New(tensor.Of(ts[0].Dtype()), tensor.WithShape(total))
	if pg.Rank() == root {
		off := 0
		for _, t := range ts {
			off += copyRaw(flat, off, t, true)
		}
	}
	if err := pg.Broadcast(ctx, flat, root).Wait(ctx); err != nil {
		return err
	}
	off := 0
	for _, t := range ts {
		off += copyRaw(flat, off, t, false)
	}
	return nil
}

// copyRaw copies t's elements into flat at off (toFlat) or back out of it,
// and returns the number of elements.
func copyRaw(flat *tensor.Dense, off int, t *tensor.Dense, toFlat bool) int {
	n := t.Shape().TotalSize()
	switch t.Dtype() {
	case tensor.Float64:
		copyDir(flat.Float64s()[off:off+n], t.Float64s()[:n], toFlat)
	case tensor.Float32:
		copyDir(flat.Float32s()[off:off+n], t.Float32s()[:n], toFlat)
	case tensor.Int64:
		copyDir(flat.Int64s()[off:off+n], t.Int64s()[:n], toFlat)
	case tensor.Int32:
		copyDir(flat.Int32s()[off:off+n], t.Int32s()[:n], toFlat)
	case tensor.Int8:
		copyDir(flat.Int8s()[off:off+n], t.Int8s()[:n], toFlat)
	case tensor.Uint8:
		copyDir(flat.Uint8s()[off:off+n], t.Uint8s()[:n], toFlat)
	default:
		panic(fmt.Sprintf("ddp: cannot broadcast dtype %v", t.Dtype())) // checked by New
	}
	return n
}

func copyDir[T any](flat, t []T, toFlat bool) {
	if toFlat {
		copy(flat, t)
	} else {
		copy(t, flat)
	}
}

// broadcastable reports whether comm can move tensors of dt.
func broadcastable(dt tensor.Dtype) bool {
	switch dt {
	case tensor.Float64, tensor.Float32, tensor.Int64, tensor.Int32, tensor.Int8, tensor.Uint8:
		return true
	}
	return false
}

func joinNames(ps []*models.Param) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// sameGraph compares rank r's graph description with rank 0's and names
// the first node where they differ.
func sameGraph(ref, other []string, r int) error {
	n := max(len(ref), len(other))
	for i := 0; i < n; i++ {
		var a, b string
		if i < len(ref) {
			a = ref[i]
		}
		if i < len(other) {
			b = other[i]
		}
		if a == b {
			continue
		}
		if a == "" {
			a = "nothing"
		}
		if b == "" {
			b = "nothing"
		}
		return fmt.Errorf("ddp: graphs differ across ranks: node %d is %s on rank 0 but %s on rank %d (rank 0's graph has %d nodes, rank %d's has %d): every rank must build the same graph: %w",
			i, a, b, r, len(ref), r, len(other), ErrMismatch)
	}
	return nil
}
