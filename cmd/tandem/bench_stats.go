package main

// Statistics and output shared by the benchmarks: medians and quantiles of
// timed steps, JSON result lines, durations for tables.

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// medianOf returns the median of xs (the mean of the two middle values when
// their count is even), 0 when xs is empty. xs is left as it was.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// quantile returns the q-quantile of ds (0 <= q <= 1) as the element at
// rank floor(q*len) of the sorted times, the last one at most; 0 when ds is
// empty. With q = 0.5 that is the upper median. ds is left as it was.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// writeJSONLine writes v to w as one line of JSON, the -json output of every
// benchmark.
func writeJSONLine(w io.Writer, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding result %+v: %w", v, err)
	}
	_, err = fmt.Fprintln(w, string(line))
	return err
}

// roundedSeconds formats s seconds as a duration rounded to unit, for tables.
func roundedSeconds(s float64, unit time.Duration) string {
	return time.Duration(s * 1e9).Round(unit).String()
}
