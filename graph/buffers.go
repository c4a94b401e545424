package graph

import (
	"cmp"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Buffer reuse. A node's output may be handed back to its op as the
// preallocated result of the next run only if the program owns that memory:
// it must not overlap any of the op's inputs (ops such as Reshape or
// Transpose return views of their input), any input value bound by the user,
// any constant, or any other kept buffer. The checks compare address ranges,
// cost nothing once the set of kept buffers stops changing, and err on the
// side of allocating.

// span is the address range of a value's memory; node is the node owning it
// as a kept buffer, or -1 for memory the program must never write.
type span struct {
	lo, hi uintptr
	node   int32
}

func spanOf(v G.Value) (span, bool) {
	if v == nil {
		return span{}, false
	}
	size := v.MemSize()
	if size == 0 {
		return span{}, false
	}
	lo := v.Uintptr()
	return span{lo: lo, hi: lo + size}, true
}

func (a span) overlaps(b span) bool { return a.lo < b.hi && b.lo < a.hi }

// disjoint reports whether v shares no memory with any of args.
func disjoint(v G.Value, args []G.Value) bool {
	s, ok := spanOf(v)
	if !ok {
		return false
	}
	for _, a := range args {
		if as, ok := spanOf(a); ok && s.overlaps(as) {
			return false
		}
	}
	return true
}

// sameMemory reports whether a and b cover the same memory (both nil counts).
func sameMemory(a, b G.Value) bool {
	sa, oka := spanOf(a)
	sb, okb := spanOf(b)
	return oka == okb && sa.lo == sb.lo && sa.hi == sb.hi
}

// dropAliasedBuffers forgets kept buffers that overlap a value bound to an
// input for this run (a user may feed last run's output back in) or an
// output set with SetOutput.
func (p *Program) dropAliasedBuffers() {
	if len(p.spans) == 0 {
		return
	}
	for _, i := range p.inputs {
		if s, ok := spanOf(p.vals[i]); ok {
			p.dropOverlapping(s)
		}
	}
	for _, i := range p.outNodes {
		if s, ok := spanOf(p.out[i]); ok {
			p.dropOverlapping(s)
		}
	}
}

// dropOverlapping forgets the kept buffers that overlap s.
func (p *Program) dropOverlapping(s span) {
	// spans are sorted by lo and pairwise disjoint, so hi is sorted too.
	k, _ := slices.BinarySearchFunc(p.spans, s.lo, func(e span, lo uintptr) int {
		if e.hi <= lo {
			return -1
		}
		return 1
	})
	for ; k < len(p.spans) && p.spans[k].lo < s.hi; k++ {
		n := p.spans[k].node
		if p.bufs[n] != nil {
			p.bufs[n] = nil
			p.next[n] = nil
			p.changed.Store(true)
		}
	}
}

// settleBuffers runs after every run: when the set of kept buffers changed it
// checks the new set against itself and against memory the program does not
// own, and keeps what passes for the next run.
func (p *Program) settleBuffers() {
	if p.changed.Load() {
		s := p.scratch[:0]
		for i, v := range p.next {
			if v == nil {
				continue
			}
			if sp, ok := spanOf(v); ok {
				sp.node = int32(i)
				s = append(s, sp)
			} else {
				p.next[i] = nil
			}
		}
		for i, v := range p.vals {
			if v == nil || (p.next[i] != nil && sameMemory(v, p.next[i])) {
				continue
			}
			if p.kind[i] == kindInput || p.owned[i] {
				if sp, ok := spanOf(v); ok {
					sp.node = -1
					s = append(s, sp)
				}
			}
		}
		slices.SortFunc(s, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
		top := -1
		for k := range s {
			if top >= 0 && s[k].lo < s[top].hi {
				if n := s[k].node; n >= 0 {
					p.next[n] = nil
				}
				if n := s[top].node; n >= 0 {
					p.next[n] = nil
				}
			}
			if top < 0 || s[k].hi > s[top].hi {
				top = k
			}
		}
		p.spans = p.spans[:0]
		for _, sp := range s {
			if sp.node >= 0 && p.next[sp.node] != nil {
				p.spans = append(p.spans, sp)
			}
		}
		p.scratch = s[:0]
	}
	copy(p.bufs, p.next)
}

// headerCopy returns a new header over the same data for a dense tensor that
// several ops read at once: some ops (a matrix product with a transposed
// operand) flip their input's shape in place while they run, which must not
// be seen by the others. Other values are returned as they are.
func headerCopy(v G.Value) G.Value {
	if d, ok := v.(*tensor.Dense); ok {
		return d.ShallowClone()
	}
	return v
}
