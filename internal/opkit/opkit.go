// Package opkit holds what every gorgonia op written for Tandem repeats
// (models' layers, ops/dist's collectives, ddp's synchronized batch norm):
// the constant answers of an op that computes in Go into memory of its own,
// the hash gorgonia merges nodes by, the arity check, and the types of a
// one-input op.
//
// A gorgonia.Op answers a dozen questions. Most of Tandem's ops answer
// ReturnsPtr, CallsExtern and OverwritesInput the same way (embed Plain),
// hash what WriteHash writes or their String form (Hash, HashString; a
// collective's hash must include its group and sequence number, or gorgonia
// merges two allreduces into one), and differentiate every input or none
// (AllDiff). The rest is each op's own.
package opkit

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/internal/errs"
)

// Plain, embedded in an op, answers for an op that returns a value of its
// own (a new tensor or the buffer it was handed), not a pointer into an
// input; that runs in Go, calling nothing external; and that overwrites none
// of its inputs.
type Plain struct{}

// ReturnsPtr is false: the result never aliases an input.
func (Plain) ReturnsPtr() bool { return false }

// CallsExtern is false: the op runs in Go.
func (Plain) CallsExtern() bool { return false }

// OverwritesInput is -1: inputs are only read.
func (Plain) OverwritesInput() int { return -1 }

// Hash is the FNV-1a hash of what op's WriteHash writes: an op's Hashcode.
func Hash(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

// HashString is the FNV-1a hash of op's String form, for ops whose String
// names everything that makes them what they are.
func HashString[O fmt.Stringer](op O) uint32 {
	h := fnv.New32a()
	fmt.Fprint(h, op.String())
	return h.Sum32()
}

// AllDiff is the DiffWRT of an op differentiable in each of its n inputs.
func AllDiff(n int) []bool {
	d := make([]bool, n)
	for i := range d {
		d[i] = true
	}
	return d
}

// CheckArity reports an error naming pkg and op when op was handed got
// inputs but takes want, wrapping errs.InvalidArgument. It is generic over
// the op's type so that the op becomes an interface (and is allocated) only
// on the error path, never in a hot Do.
func CheckArity[O fmt.Stringer](pkg string, op O, got, want int) error {
	switch {
	case got == want:
		return nil
	case want == 1:
		return fmt.Errorf("%s: %v takes 1 input, got %d: %w", pkg, op, got, errs.InvalidArgument)
	default:
		return fmt.Errorf("%s: %v takes %d inputs, got %d: %w", pkg, op, want, got, errs.InvalidArgument)
	}
}

// Unary, embedded in an op of one input whose input and output types are
// known when the node is built, answers Arity and Type.
type Unary struct {
	In, Out hm.Type
}

// Arity is 1.
func (Unary) Arity() int { return 1 }

// Type is In → Out, a fresh value each call: gorgonia recycles function
// types.
func (u Unary) Type() hm.Type { return hm.NewFnType(u.In, u.Out) }

// TypeOf is the gorgonia type of a value of the given shape and dtype: the
// dtype for a scalar, a tensor type otherwise.
func TypeOf(dims int, dt hm.Type) hm.Type {
	if dims == 0 {
		return dt
	}
	return G.TensorType{Dims: dims, Of: dt}
}
