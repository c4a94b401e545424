package data

import (
	"fmt"
	"sync/atomic"
)

// Sampler chooses the order in which a Loader visits a data set's examples.
// Implementations must be safe for concurrent use.
type Sampler interface {
	// Indices returns the data set indices to visit in the given epoch, in
	// order. The result belongs to the caller.
	Indices(epoch int) []int
	// Len is the number of indices Indices returns (the same every epoch).
	Len() int
}

// SequentialSampler visits 0, 1, ..., n-1 every epoch.
type SequentialSampler struct{ n int }

// NewSequentialSampler returns a sampler over n examples in order.
func NewSequentialSampler(n int) (*SequentialSampler, error) {
	if n < 0 {
		return nil, fmt.Errorf("data: negative data set size %d: %w", n, ErrInvalidArgument)
	}
	return &SequentialSampler{n: n}, nil
}

// Indices returns 0..n-1.
func (s *SequentialSampler) Indices(int) []int {
	p := make([]int, s.n)
	for i := range p {
		p[i] = i
	}
	return p
}

// Len is n.
func (s *SequentialSampler) Len() int { return s.n }

// RandomSampler visits all n examples in a random order that depends on the
// seed and the epoch only.
type RandomSampler struct {
	n    int
	seed uint64
}

// NewRandomSampler returns a shuffling sampler over n examples.
func NewRandomSampler(n int, seed uint64) (*RandomSampler, error) {
	if n < 0 {
		return nil, fmt.Errorf("data: negative data set size %d: %w", n, ErrInvalidArgument)
	}
	return &RandomSampler{n: n, seed: seed}, nil
}

// Indices returns the permutation for epoch (keyed by seed+epoch).
func (s *RandomSampler) Indices(epoch int) []int { return permutation(s.n, s.seed+uint64(epoch)) }

// Len is n.
func (s *RandomSampler) Len() int { return s.n }

// DistributedSampler gives each of numReplicas ranks its own share of a data
// set, as torch.utils.data.distributed.DistributedSampler does:
//
//   - the epoch's order is 0..n-1, or with shuffling (the default) a
//     permutation keyed by seed+epoch, the same on every rank;
//   - without DropLast the order is padded to a multiple of numReplicas by
//     repeating its head (as often as needed), so every rank gets
//     ceil(n/numReplicas) indices and a few examples are seen twice;
//   - with DropLast it is cut to floor(n/numReplicas)*numReplicas;
//   - rank r takes positions r, r+numReplicas, r+2*numReplicas, ...
//
// The permutation is not torch's (torch draws it from its own generator,
// which this package does not reproduce); the semantics above are.
type DistributedSampler struct {
	n, replicas, rank int
	shuffle, dropLast bool
	seed              uint64
	epoch             atomic.Int64
}

// NewDistributedSampler returns rank's sampler over a data set of n examples
// shared by numReplicas ranks. Options: Shuffle(seed) (default: shuffle with
// seed 0), NoShuffle, DropLast.
func NewDistributedSampler(n, numReplicas, rank int, opts ...Option) (*DistributedSampler, error) {
	o := options{shuffle: true}
	if err := o.apply("DistributedSampler", []string{"Shuffle", "NoShuffle", "DropLast"}, opts); err != nil {
		return nil, err
	}
	if o.set["Shuffle"] && o.set["NoShuffle"] {
		return nil, fmt.Errorf("data: DistributedSampler: both Shuffle and NoShuffle given: %w", ErrInvalidArgument)
	}
	switch {
	case n < 0:
		return nil, fmt.Errorf("data: DistributedSampler: negative data set size %d: %w", n, ErrInvalidArgument)
	case numReplicas < 1:
		return nil, fmt.Errorf("data: DistributedSampler: %d replicas (need at least 1): %w", numReplicas, ErrInvalidArgument)
	case rank < 0 || rank >= numReplicas:
		return nil, fmt.Errorf("data: DistributedSampler: rank %d out of range [0, %d): %w", rank, numReplicas, ErrInvalidArgument)
	}
	return &DistributedSampler{n: n, replicas: numReplicas, rank: rank, shuffle: o.shuffle, dropLast: o.dropLast, seed: o.seed}, nil
}

// Len is the number of indices each rank gets per epoch.
func (s *DistributedSampler) Len() int {
	if s.dropLast && s.n%s.replicas != 0 {
		return s.n / s.replicas
	}
	return (s.n + s.replicas - 1) / s.replicas
}

// TotalSize is Len times the number of replicas: the padded (or trimmed)
// length of the epoch's order.
func (s *DistributedSampler) TotalSize() int { return s.Len() * s.replicas }

// SetEpoch sets the epoch that Order uses (torch: sampler.set_epoch(e)). A
// Loader passes its epoch to Indices directly and needs no SetEpoch.
func (s *DistributedSampler) SetEpoch(epoch int) { s.epoch.Store(int64(epoch)) }

// Order returns this rank's indices for the epoch last set by SetEpoch
// (initially 0), as iterating a torch DistributedSampler does.
func (s *DistributedSampler) Order() []int { return s.Indices(int(s.epoch.Load())) }

// Indices returns this rank's indices for epoch.
func (s *DistributedSampler) Indices(epoch int) []int {
	var order []int
	if s.shuffle {
		order = permutation(s.n, s.seed+uint64(epoch))
	} else {
		order = make([]int, s.n)
		for i := range order {
			order[i] = i
		}
	}
	total := s.TotalSize()
	if pad := total - len(order); pad > 0 && len(order) > 0 {
		head := order
		for pad > 0 {
			k := min(pad, len(head))
			order = append(order, head[:k]...)
			pad -= k
		}
	}
	order = order[:total]
	mine := make([]int, 0, s.Len())
	for i := s.rank; i < total; i += s.replicas {
		mine = append(mine, order[i])
	}
	return mine
}
