package commtest

import (
	"fmt"
	"math"
	"reflect"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/flat"
	"gorgonia.org/tensor"
)

var dtypes = []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int8, tensor.Uint8, tensor.Int32, tensor.Int64}

func isFloat(dt tensor.Dtype) bool { return dt == tensor.Float32 || dt == tensor.Float64 }

// val is rank's i-th input value: small integers in [-3, 3], so that float
// sums and products are exact in any order.
func val(rank, i int) int64 { return int64((rank*5+i*3+1)%7 - 3) }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// newTensor returns a tensor of dt and shape whose i-th element is f(i)
// converted to dt (wrapping for the narrow integer types).
func newTensor(dt tensor.Dtype, shape []int, f func(i int) int64) *tensor.Dense {
	n := numel(shape)
	var backing any
	switch dt {
	case tensor.Float32:
		backing = fill(n, func(i int) float32 { return float32(f(i)) })
	case tensor.Float64:
		backing = fill(n, func(i int) float64 { return float64(f(i)) })
	case tensor.Int8:
		backing = fill(n, func(i int) int8 { return int8(f(i)) })
	case tensor.Uint8:
		backing = fill(n, func(i int) uint8 { return uint8(f(i)) })
	case tensor.Int32:
		backing = fill(n, func(i int) int32 { return int32(f(i)) })
	case tensor.Int64:
		backing = fill(n, f)
	default:
		panic(fmt.Sprintf("commtest: dtype %v", dt))
	}
	if len(shape) == 0 {
		return tensor.New(tensor.FromScalar(reflect.ValueOf(backing).Index(0).Interface()))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing))
}

func fill[T any](n int, f func(int) T) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = f(i)
	}
	return s
}

// zeros returns a tensor of dt and shape filled with a marker value (-7), so
// that a position a collective forgot to write shows.
func zeros(dt tensor.Dtype, shape []int) *tensor.Dense {
	return newTensor(dt, shape, func(int) int64 { return -7 })
}

// values returns t's elements as float64 (exact for every supported dtype at
// the magnitudes the suite uses).
func values(t *tensor.Dense) []float64 {
	if t.IsScalar() {
		b, ok := flat.New(t.Dtype(), 1)
		if !ok || !b.SetFirst(t.ScalarValue()) {
			panic(fmt.Sprintf("commtest: scalar of type %T", t.ScalarValue()))
		}
		return b.Float64s()
	}
	if t.Shape().TotalSize() == 0 {
		return []float64{}
	}
	b, ok := flat.Of(t.Data())
	if !ok {
		panic(fmt.Sprintf("commtest: data of type %T", t.Data()))
	}
	return b.Float64s()
}

// expected computes, element by element, the reduction with op of inputs[r]
// over ranks r, in dt's arithmetic (wrapping integers, truncating integer
// average), as float64.
func expected(dt tensor.Dtype, op comm.ReduceOp, inputs [][]int64) []float64 {
	switch dt {
	case tensor.Float32:
		return refFloat[float32](op, inputs)
	case tensor.Float64:
		return refFloat[float64](op, inputs)
	case tensor.Int8:
		return refInt[int8](op, inputs)
	case tensor.Uint8:
		return refInt[uint8](op, inputs)
	case tensor.Int32:
		return refInt[int32](op, inputs)
	case tensor.Int64:
		return refInt[int64](op, inputs)
	}
	panic("commtest: dtype")
}

func refFloat[T float32 | float64](op comm.ReduceOp, inputs [][]int64) []float64 {
	n := len(inputs)
	out := make([]float64, len(inputs[0]))
	for i := range out {
		acc := T(inputs[0][i])
		if op.Kind() == comm.KindPremulSum {
			acc *= T(op.Factor())
		}
		for r := 1; r < n; r++ {
			x := T(inputs[r][i])
			switch op.Kind() {
			case comm.KindSum, comm.KindAvg:
				acc += x
			case comm.KindPremulSum:
				acc += x * T(op.Factor())
			case comm.KindProduct:
				acc *= x
			case comm.KindMin:
				acc = min(acc, x)
			case comm.KindMax:
				acc = max(acc, x)
			default:
				panic("commtest: float op " + op.String())
			}
		}
		if op.Kind() == comm.KindAvg {
			acc /= T(n)
		}
		out[i] = float64(acc)
	}
	return out
}

func refInt[T int8 | uint8 | int32 | int64](op comm.ReduceOp, inputs [][]int64) []float64 {
	n := len(inputs)
	out := make([]float64, len(inputs[0]))
	f := T(int64(op.Factor()))
	for i := range out {
		acc := T(inputs[0][i])
		if op.Kind() == comm.KindPremulSum {
			acc *= f
		}
		for r := 1; r < n; r++ {
			x := T(inputs[r][i])
			switch op.Kind() {
			case comm.KindSum, comm.KindAvg:
				acc += x
			case comm.KindPremulSum:
				acc += x * f
			case comm.KindProduct:
				acc *= x
			case comm.KindMin:
				acc = min(acc, x)
			case comm.KindMax:
				acc = max(acc, x)
			case comm.KindBAnd:
				acc &= x
			case comm.KindBOr:
				acc |= x
			case comm.KindBXor:
				acc ^= x
			default:
				panic("commtest: int op " + op.String())
			}
		}
		if op.Kind() == comm.KindAvg {
			acc = T(int64(acc) / int64(n))
		}
		out[i] = float64(acc)
	}
	return out
}

// inputsOf returns every rank's inputs (val) for count elements starting at
// element offset.
func inputsOf(n, offset, count int) [][]int64 {
	in := make([][]int64, n)
	for r := range in {
		in[r] = make([]int64, count)
		for i := range in[r] {
			in[r][i] = val(r, offset+i)
		}
	}
	return in
}

// castAll returns xs as dt would store them, as float64.
func castAll(dt tensor.Dtype, xs []int64) []float64 {
	return values(newTensor(dt, []int{len(xs)}, func(i int) int64 { return xs[i] }))
}

func equal(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
			return false
		}
	}
	return true
}

// opsFor returns the reduce ops that apply to dt, and the bitwise ones that
// must be refused on floats.
func opsFor(dt tensor.Dtype) (ok, refused []comm.ReduceOp) {
	ok = []comm.ReduceOp{comm.Sum, comm.Avg, comm.Product, comm.Min, comm.Max}
	bit := []comm.ReduceOp{comm.BAnd, comm.BOr, comm.BXor}
	if isFloat(dt) {
		return append(ok, comm.PremulSum(0.5)), bit
	}
	return append(append(ok, comm.PremulSum(3)), bit...), nil
}
