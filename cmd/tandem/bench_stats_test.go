package main

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"
)

func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{4, 1}, 2.5},
		{[]float64{5, 1, 3}, 3},
		{[]float64{9, 1, 4, 2}, 3},
	} {
		in := slices.Clone(c.in)
		if got := medianOf(in); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("medianOf reordered its input: %v", in)
		}
	}
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{40, 10, 30, 20}
	for q, want := range map[float64]time.Duration{0: 10, 0.5: 30, 0.74: 30, 0.75: 40, 0.99: 40, 1: 40} {
		if got := quantile(ds, q); got != want {
			t.Errorf("quantile(%v, %v) = %v, want %v", ds, q, got, want)
		}
	}
	if ds[0] != 40 {
		t.Errorf("quantile reordered its input: %v", ds)
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of nothing = %v", got)
	}
}

func TestWriteJSONLine(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSONLine(&b, struct {
		A int     `json:"a"`
		S string  `json:"s"`
		F float64 `json:"f"`
	}{1, "<x>", 0.5}); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), `{"a":1,"s":"\u003cx\u003e","f":0.5}`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if err := writeJSONLine(&b, math.Inf(1)); err == nil {
		t.Error("an infinite result was written")
	}
}

func TestParseInts(t *testing.T) {
	got, err := parseInts("1, 16,256")
	if err != nil || !slices.Equal(got, []int{1, 16, 256}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "1,,2", "0", "-3", "4K"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q): want an error", bad)
		}
	}
	if s, err := parseLayerSizes("12,4"); err != nil || !slices.Equal(s, []int{12, 4}) {
		t.Errorf("parseLayerSizes: %v, %v", s, err)
	}
	if _, err := parseLayerSizes("12"); err == nil {
		t.Error("one layer size accepted")
	}
}
