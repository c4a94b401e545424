package elastic

import (
	"fmt"

	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/internal/errs"
)

// BatchRule says how a step's batch and learning rate follow the world's
// size when members come and go. It is explicit because there is no right
// answer for every model: keeping the global batch keeps the optimization
// the same step for step (the gradient is the mean over the same number of
// examples) at the price of more work per rank on a smaller world; keeping
// the per-rank batch keeps each rank's work the same and changes the global
// batch, which the learning rate usually follows (the linear scaling rule).
type BatchRule interface {
	// Batch returns the examples each of size ranks takes per step and the
	// factor the base learning rate is multiplied by at that size.
	Batch(size int) (perRank int, lrScale float64, err error)
	// String describes the rule for logs.
	String() string
}

// FixedGlobalBatch keeps the global batch at global examples per step
// whatever the world's size, and the learning rate unchanged. Each of size
// ranks takes global/size examples; a size that does not divide global is
// refused at the round that would have it (an error naming the sizes that
// work), since ranks with unequal batches would weigh their examples
// unequally in DDP's average.
func FixedGlobalBatch(global int) BatchRule { return fixedGlobal(global) }

type fixedGlobal int

func (g fixedGlobal) Batch(size int) (int, float64, error) {
	if g < 1 || size < 1 {
		return 0, 0, fmt.Errorf("%w: elastic: FixedGlobalBatch(%d) at world size %d: both must be positive", errs.InvalidArgument, int(g), size)
	}
	if int(g)%size != 0 {
		var ok []int
		for s := 1; s <= int(g) && len(ok) < 8; s++ {
			if int(g)%s == 0 {
				ok = append(ok, s)
			}
		}
		return 0, 0, fmt.Errorf("%w: elastic: FixedGlobalBatch(%d) cannot be split evenly over %d ranks; pick a global batch every possible world size divides (this one works with %v), or PerRankBatch",
			errs.InvalidArgument, int(g), size, ok)
	}
	return int(g) / size, 1, nil
}

func (g fixedGlobal) String() string { return fmt.Sprintf("fixed global batch %d", int(g)) }

// PerRankBatch keeps perRank examples per rank per step, so the global
// batch is perRank times the world's size; the learning rate stays as given
// (see PerRankBatchScaleLR).
func PerRankBatch(perRank int) BatchRule { return perRankRule{perRank, 1, false} }

// PerRankBatchScaleLR is PerRankBatch with a learning rate that follows the
// global batch linearly (Goyal et al.'s rule): it is multiplied by
// size/baseSize, so a job tuned at baseSize ranks keeps its per-example step.
func PerRankBatchScaleLR(perRank, baseSize int) BatchRule {
	return perRankRule{perRank, baseSize, true}
}

type perRankRule struct {
	perRank, base int
	scale         bool
}

func (p perRankRule) Batch(size int) (int, float64, error) {
	if p.perRank < 1 || size < 1 || p.base < 1 {
		return 0, 0, fmt.Errorf("%w: elastic: %v at world size %d: the batch, base size and world size must all be positive", errs.InvalidArgument, p, size)
	}
	if !p.scale {
		return p.perRank, 1, nil
	}
	return p.perRank, float64(size) / float64(p.base), nil
}

func (p perRankRule) String() string {
	if p.scale {
		return fmt.Sprintf("%d per rank, learning rate scaled by size/%d", p.perRank, p.base)
	}
	return fmt.Sprintf("%d per rank, learning rate unchanged", p.perRank)
}

// Stream is the order in which a job visits its data set: an endless
// stream of epochs, each the sampler's order for that epoch. A committed
// step consumes the next global-batch positions of the stream, whatever
// the world's size was, so a job that shrinks or grows mid-epoch neither
// skips nor repeats an example: position p is example order(p / n)[p % n].
type Stream struct {
	s     data.Sampler
	n     int
	epoch int   // the epoch cached in order
	order []int // s.Indices(epoch)
}

// NewStream returns the stream of sampler's epochs (a data.RandomSampler
// for a shuffled set, seeded alike on every member; a
// data.SequentialSampler for a fixed order).
func NewStream(s data.Sampler) (*Stream, error) {
	if s == nil || s.Len() < 1 {
		return nil, fmt.Errorf("%w: elastic: NewStream: the sampler is nil or empty", errs.InvalidArgument)
	}
	return &Stream{s: s, n: s.Len(), epoch: -1}, nil
}

// Len is the number of examples in one epoch.
func (st *Stream) Len() int { return st.n }

// Epoch is the epoch that stream position pos falls in.
func (st *Stream) Epoch(pos int64) int { return int(pos / int64(st.n)) }

// Indices returns the data-set indices of count positions from pos.
func (st *Stream) Indices(pos int64, count int) []int {
	out := make([]int, count)
	for i := range out {
		p := pos + int64(i)
		e := int(p / int64(st.n))
		if e != st.epoch {
			st.order, st.epoch = st.s.Indices(e), e
		}
		out[i] = st.order[p%int64(st.n)]
	}
	return out
}
