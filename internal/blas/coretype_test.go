package blas

import "testing"

func TestBetterOpenBLASCore(t *testing.T) {
	cases := []struct{ detected, best, want string }{
		{"Prescott", "SkylakeX", "SkylakeX"}, // the fallback on an unrecognised processor
		{"Haswell", "SkylakeX", "SkylakeX"},
		{"SKYLAKEX", "SkylakeX", ""},
		{"Cooperlake", "SkylakeX", ""},
		{"Sandybridge", "Haswell", "Haswell"},
		{"Zen", "Haswell", ""},
		{"SkylakeX", "Haswell", ""}, // never downgrade
		{"", "SkylakeX", ""},        // unknown: leave OpenBLAS alone
		{"Prescott", "", ""},        // a processor without AVX2
	}
	for _, c := range cases {
		if got := BetterOpenBLASCore(c.detected, c.best); got != c.want {
			t.Errorf("BetterOpenBLASCore(%q, %q) = %q, want %q", c.detected, c.best, got, c.want)
		}
	}
}
