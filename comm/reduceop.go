package comm

import (
	"math"
	"strconv"
)

// ReduceKind names the arithmetic of a ReduceOp.
type ReduceKind uint8

// The reduce kinds. The zero ReduceKind is invalid.
const (
	KindSum ReduceKind = iota + 1
	KindAvg
	KindProduct
	KindMin
	KindMax
	KindBAnd
	KindBOr
	KindBXor
	KindPremulSum
)

var kindNames = [...]string{"invalid", "sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"}

// String returns the kind's lower-case name ("sum", "premul_sum").
func (k ReduceKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "invalid(" + strconv.Itoa(int(k)) + ")"
}

// ReduceOp says how collectives combine the ranks' values.
//
//   - Sum, Product, Min, Max: elementwise. Integer arithmetic wraps around
//     (two's complement), as in PyTorch. Min and Max propagate NaN.
//   - Avg: the sum divided by the number of ranks. On integer tensors the
//     division truncates toward zero (as C and Go integer division do, and as
//     NCCL's average does); PyTorch's gloo backend refuses Avg altogether.
//   - BAnd, BOr, BXor: bitwise, integer tensors only; on float tensors the
//     collective fails with ErrInvalidArgument.
//   - PremulSum(f): each rank's value is multiplied by f, then summed. On
//     integer tensors f must be a whole number.
//
// On float16 and bfloat16 tensors every op but the bitwise ones runs in
// float32: each rank's values are widened (exactly), combined in rank order
// (PremulSum's factor applied to each in float32, Avg's division to the
// float32 total), and the result is rounded to 16 bits once, to nearest,
// ties to even. No partial result is rounded to 16 bits on its way (gloo's
// float16 rounds after every addition), so AllReduce, Reduce and
// ReduceScatter give the same bits for the same inputs on every algorithm,
// and only 16-bit values cross the network.
//
// The zero ReduceOp is invalid.
type ReduceOp struct {
	kind   ReduceKind
	factor float64
}

// The reduce operations.
var (
	Sum     = ReduceOp{kind: KindSum}
	Avg     = ReduceOp{kind: KindAvg}
	Product = ReduceOp{kind: KindProduct}
	Min     = ReduceOp{kind: KindMin}
	Max     = ReduceOp{kind: KindMax}
	BAnd    = ReduceOp{kind: KindBAnd}
	BOr     = ReduceOp{kind: KindBOr}
	BXor    = ReduceOp{kind: KindBXor}
)

// PremulSum returns the op that multiplies every rank's value by factor and
// then sums them (PyTorch's PREMUL_SUM); PremulSum(1/n) is an average that
// scales before adding.
func PremulSum(factor float64) ReduceOp { return ReduceOp{kind: KindPremulSum, factor: factor} }

// Kind returns the op's kind.
func (o ReduceOp) Kind() ReduceKind { return o.kind }

// Factor returns PremulSum's factor (0 for other ops).
func (o ReduceOp) Factor() float64 { return o.factor }

// String returns the op's name as fingerprints and errors show it ("sum",
// "premul_sum(0.25)").
func (o ReduceOp) String() string {
	if o.kind == KindPremulSum {
		return "premul_sum(" + strconv.FormatFloat(o.factor, 'g', -1, 64) + ")"
	}
	return o.kind.String()
}

func (o ReduceOp) valid() bool { return o.kind >= KindSum && o.kind <= KindPremulSum }

// checkFor reports whether o can reduce tensors of dtype d.
func (o ReduceOp) checkFor(d dtype) error {
	if !o.valid() {
		return errorf(ErrInvalidArgument, "reduce op %v is not one of Sum, Avg, Product, Min, Max, BAnd, BOr, BXor, PremulSum", o)
	}
	switch o.kind {
	case KindBAnd, KindBOr, KindBXor:
		if d.isFloat() {
			return errorf(ErrInvalidArgument, "reduce op %v needs an integer tensor, got %v; use an integer dtype or another op", o, d)
		}
	case KindPremulSum:
		if math.IsNaN(o.factor) || math.IsInf(o.factor, 0) {
			return errorf(ErrInvalidArgument, "premul_sum factor %v is not finite", o.factor)
		}
		if !d.isFloat() && o.factor != math.Trunc(o.factor) {
			return errorf(ErrInvalidArgument, "premul_sum factor %v on %v tensor must be a whole number", o.factor, d)
		}
	}
	return nil
}
