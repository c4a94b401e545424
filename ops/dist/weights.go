package dist

import (
	"fmt"
	"math"

	"github.com/tandemml/tandem/comm"
)

// This file computes, for the reductions that are not linear, how much of the
// upstream gradient each rank's contribution receives. With V_0..V_{w-1} the
// ranks' values of one element and y their reduction:
//
//   - product: dy/dV_q is the product of the other ranks' values, computed
//     from prefix and suffix products, so a zero anywhere is handled exactly
//     (no division by V_q);
//   - max and min: every rank holding the extreme value gets an equal share,
//     1/count, the others none. NaN is the extreme when present (the
//     reductions propagate it), so ranks holding NaN share then.

type float interface{ ~float32 | ~float64 }

// mulWeights multiplies out (n elements) by rank's weight, given every
// rank's values xs (w blocks of n elements, rank q's block at q*n).
func mulWeights(out, xs any, w, n, rank int, red comm.ReduceOp) error {
	switch o := out.(type) {
	case []float64:
		return mulWeightsT(o, xs.([]float64), w, n, rank, red)
	case []float32:
		return mulWeightsT(o, xs.([]float32), w, n, rank, red)
	}
	return fmt.Errorf("gradients of %v need float32 or float64 tensors, got %T: %w", red, out, ErrNotDifferentiable)
}

func mulWeightsT[T float](out, xs []T, w, n, rank int, red comm.ReduceOp) error {
	vals := make([]T, w)
	for i := 0; i < n; i++ {
		for q := range vals {
			vals[q] = xs[q*n+i]
		}
		wt, err := weight(vals, rank, red)
		if err != nil {
			return err
		}
		out[i] *= wt
	}
	return nil
}

// shareGrads fills shares (w blocks of n) with, for each contributor q,
// g times q's weight among the values got (w blocks of n: contributor q's
// value of each element at block q).
func shareGrads(shares, got, g any, w, n int, red comm.ReduceOp) error {
	switch s := shares.(type) {
	case []float64:
		return shareGradsT(s, got.([]float64), g.([]float64), w, n, red)
	case []float32:
		return shareGradsT(s, got.([]float32), g.([]float32), w, n, red)
	}
	return fmt.Errorf("gradients of %v need float32 or float64 tensors, got %T: %w", red, shares, ErrNotDifferentiable)
}

func shareGradsT[T float](shares, got, g []T, w, n int, red comm.ReduceOp) error {
	vals := make([]T, w)
	for i := 0; i < n; i++ {
		for q := range vals {
			vals[q] = got[q*n+i]
		}
		for q := 0; q < w; q++ {
			wt, err := weight(vals, q, red)
			if err != nil {
				return err
			}
			shares[q*n+i] = g[i] * wt
		}
	}
	return nil
}

// weight returns d reduce(vals) / d vals[q].
func weight[T float](vals []T, q int, red comm.ReduceOp) (T, error) {
	switch red.Kind() {
	case comm.KindProduct:
		p := T(1)
		for j := 0; j < q; j++ {
			p *= vals[j]
		}
		s := T(1)
		for j := q + 1; j < len(vals); j++ {
			s *= vals[j]
		}
		return p * s, nil
	case comm.KindMax, comm.KindMin:
		y := extreme(vals, red.Kind() == comm.KindMax)
		if !holds(vals[q], y) {
			return 0, nil
		}
		count := 0
		for _, v := range vals {
			if holds(v, y) {
				count++
			}
		}
		return 1 / T(count), nil
	}
	return 0, fmt.Errorf("no weighted gradient for reduce op %v: %w", red, ErrNotDifferentiable)
}

// extreme returns the maximum (or minimum) of vals, NaN if any is NaN.
func extreme[T float](vals []T, max bool) T {
	y := vals[0]
	for _, v := range vals {
		switch {
		case isNaN(v):
			return v
		case max && v > y, !max && v < y:
			y = v
		}
	}
	return y
}

// holds reports whether v is the extreme value y (NaN holds NaN).
func holds[T float](v, y T) bool { return v == y || (isNaN(y) && isNaN(v)) }

func isNaN[T float](v T) bool { return math.IsNaN(float64(v)) }
