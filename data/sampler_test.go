package data

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// interleave rebuilds the epoch's padded order from every rank's share: rank
// r holds positions r, r+R, r+2R, ...
func interleave(shares [][]int) []int {
	R := len(shares)
	full := make([]int, len(shares[0])*R)
	for r, s := range shares {
		for i, v := range s {
			full[i*R+r] = v
		}
	}
	return full
}

func TestDistributedSamplerSemantics(t *testing.T) {
	for _, n := range []int{0, 1, 2, 5, 10, 11, 17, 100} {
		for _, R := range []int{1, 2, 3, 4, 7} {
			for _, shuffle := range []bool{false, true} {
				for _, drop := range []bool{false, true} {
					name := fmt.Sprintf("n=%d/R=%d/shuffle=%v/drop=%v", n, R, shuffle, drop)
					t.Run(name, func(t *testing.T) { checkShards(t, n, R, shuffle, drop) })
				}
			}
		}
	}
}

func checkShards(t *testing.T, n, R int, shuffle, drop bool) {
	const epoch = 3
	var opts []Option
	if shuffle {
		opts = append(opts, Shuffle(7))
	} else {
		opts = append(opts, NoShuffle())
	}
	if drop {
		opts = append(opts, DropLast())
	}
	want := (n + R - 1) / R
	if drop && n%R != 0 {
		want = n / R
	}
	shares := make([][]int, R)
	for r := range shares {
		s, err := NewDistributedSampler(n, R, r, opts...)
		if err != nil {
			t.Fatal(err)
		}
		shares[r] = s.Indices(epoch)
		if len(shares[r]) != want || s.Len() != want || s.TotalSize() != want*R {
			t.Fatalf("rank %d: %d indices, Len %d, TotalSize %d; want %d per rank", r, len(shares[r]), s.Len(), s.TotalSize(), want)
		}
	}
	full := interleave(shares)
	total := want * R
	// The first min(n, total) entries are distinct indices of [0, n): the
	// ranks agree on one order, so their shares are disjoint.
	head := full[:min(n, total)]
	seen := map[int]bool{}
	for _, v := range head {
		if v < 0 || v >= n || seen[v] {
			t.Fatalf("order %v: %d repeated or out of range in its first %d entries", full, v, len(head))
		}
		seen[v] = true
	}
	if !drop && len(seen) != n {
		t.Fatalf("without drop_last every example must be covered: %d of %d", len(seen), n)
	}
	// Padding repeats the head of the order, as often as needed.
	for i := n; i < total; i++ {
		if full[i] != full[i%n] {
			t.Fatalf("padding: position %d holds %d, want the head's %d (order %v)", i, full[i], full[i%n], full)
		}
	}
	if !shuffle && !slices.Equal(head, seq(len(head))) {
		t.Fatalf("without shuffle the order must be 0..n-1, got %v", full)
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestDistributedSamplerTorchExample checks the layout torch documents for
// 10 examples over 3 replicas.
func TestDistributedSamplerTorchExample(t *testing.T) {
	want := map[bool][][]int{
		false: {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}},
		true:  {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}},
	}
	for drop, ranks := range want {
		for r, w := range ranks {
			opts := []Option{NoShuffle()}
			if drop {
				opts = append(opts, DropLast())
			}
			s, _ := NewDistributedSampler(10, 3, r, opts...)
			if got := s.Indices(0); !slices.Equal(got, w) {
				t.Errorf("drop_last=%v rank %d: %v, want %v", drop, r, got, w)
			}
		}
	}
	// More replicas than examples: the head is repeated several times.
	for r, w := range []int{0, 1, 0, 1, 0} {
		s, _ := NewDistributedSampler(2, 5, r, NoShuffle())
		if got := s.Indices(0); !slices.Equal(got, []int{w}) {
			t.Errorf("n=2 R=5 rank %d: %v, want [%d]", r, got, w)
		}
	}
}

func TestDistributedSamplerEpochsAndSeeds(t *testing.T) {
	a, _ := NewDistributedSampler(1000, 4, 1, Shuffle(11))
	b, _ := NewDistributedSampler(1000, 4, 1, Shuffle(11))
	c, _ := NewDistributedSampler(1000, 4, 1, Shuffle(12))
	if !slices.Equal(a.Indices(5), b.Indices(5)) {
		t.Fatal("same seed and epoch gave different orders")
	}
	if slices.Equal(a.Indices(5), a.Indices(6)) {
		t.Fatal("a new epoch did not change the order")
	}
	if slices.Equal(a.Indices(5), c.Indices(5)) {
		t.Fatal("another seed did not change the order")
	}
	// Torch keys the permutation by seed+epoch.
	if !slices.Equal(a.Indices(6), c.Indices(5)) {
		t.Fatal("seed 11 epoch 6 and seed 12 epoch 5 must agree (the key is seed+epoch)")
	}
	d, _ := NewDistributedSampler(1000, 4, 1) // default: shuffle with seed 0
	if slices.Equal(d.Indices(0)[:5], []int{1, 5, 9, 13, 17}) {
		t.Fatal("the default must shuffle")
	}
	a.SetEpoch(9)
	if !slices.Equal(a.Order(), a.Indices(9)) {
		t.Fatal("Order after SetEpoch(9) differs from Indices(9)")
	}
}

func TestSamplerArguments(t *testing.T) {
	for name, err := range map[string]error{
		"rank too big":     second(NewDistributedSampler(10, 2, 2)),
		"negative rank":    second(NewDistributedSampler(10, 2, -1)),
		"no replicas":      second(NewDistributedSampler(10, 0, 0)),
		"negative n":       second(NewDistributedSampler(-1, 2, 0)),
		"both shuffles":    second(NewDistributedSampler(10, 2, 0, Shuffle(1), NoShuffle())),
		"loader option":    second(NewDistributedSampler(10, 2, 0, Prefetch(3))),
		"negative random":  second(NewRandomSampler(-3, 0)),
		"negative ordered": second(NewSequentialSampler(-3)),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestPermutation pins the shuffle (it must never change between releases,
// or resumed runs would see other orders) and checks it is unbiased enough
// to notice a broken bounded-integer draw.
func TestPermutation(t *testing.T) {
	got := permutation(10, 42)
	pinned := []int{1, 9, 2, 6, 5, 4, 8, 0, 7, 3}
	if !slices.Equal(got, pinned) {
		t.Fatalf("permutation(10, 42) = %v; it was %v: the shuffle changed", got, pinned)
	}
	const n, trials = 8, 16000
	var counts [n][n]int // counts[v][pos]
	for k := 0; k < trials; k++ {
		for pos, v := range permutation(n, uint64(k)) {
			counts[v][pos]++
		}
	}
	exp := float64(trials) / n
	chi := 0.0
	for v := range counts {
		for pos := range counts[v] {
			d := float64(counts[v][pos]) - exp
			chi += d * d / exp
		}
	}
	// 49 degrees of freedom: the 99.99th percentile is about 97.
	if chi > 97 {
		t.Fatalf("position counts look biased: chi-square %.1f over 49 degrees of freedom", chi)
	}
}

func second[T any](_ T, err error) error { return err }
