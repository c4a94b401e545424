package ddp

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// PowerSGDState is the state of PowerSGDHook (PyTorch's PowerSGDState): its
// settings, the iteration count, and per bucket the low-rank factors kept for
// warm starts and the local compression errors fed back into the next step.
// Build it with NewPowerSGDState and give the same settings on every rank.
type PowerSGDState struct {
	group       *comm.ProcessGroup
	rank        int
	startIter   int
	minRate     float64
	feedback    bool
	warmStart   bool
	epsilon     float64
	seed        uint64
	mu          sync.Mutex
	iter        int
	rng         *rand.Rand
	errs        map[int][]float64
	qs          map[int][]float64
	numelBefore int64
	numelAfter  int64
}

// PowerSGDConfig holds PowerSGD's settings, named after the arguments of
// PyTorch's PowerSGDState. Start from DefaultPowerSGDConfig, which holds
// PyTorch's defaults, and change what differs; give the same settings on
// every rank.
type PowerSGDConfig struct {
	// Rank is the rank of the approximation of each gradient matrix
	// (matrix_approximation_rank, default 1).
	Rank int
	// StartIter is how many steps run with plain all-reduce before
	// compression starts (start_powerSGD_iter, default 1000). With error
	// feedback or warm start it must be at least 2, since the buckets are
	// rebuilt after the first step.
	StartIter int
	// MinCompressionRate is how much a matrix must shrink to be compressed
	// (min_compression_rate, default 2): an n×m gradient is compressed when
	// (n+m)·rank·rate < n·m; other gradients are all-reduced as they are.
	MinCompressionRate float64
	// ErrorFeedback adds the local compression error to the next step's
	// gradients (use_error_feedback, default on).
	ErrorFeedback bool
	// WarmStart starts each step's power iteration from the previous step's
	// factors (warm_start, default on) rather than from fresh random ones.
	WarmStart bool
	// Epsilon is added to column norms during orthogonalization
	// (orthogonalization_epsilon, default 0).
	Epsilon float64
	// Seed seeds the random initial factors (random_seed, default 0); every
	// rank must use the same seed.
	Seed uint64
}

// DefaultPowerSGDConfig returns PyTorch's defaults: rank 1, compression from
// step 1000 for matrices that shrink at least twofold, error feedback and
// warm start on, no epsilon, seed 0.
func DefaultPowerSGDConfig() PowerSGDConfig {
	return PowerSGDConfig{Rank: 1, StartIter: 1000, MinCompressionRate: 2, ErrorFeedback: true, WarmStart: true}
}

// check reports the first setting out of range.
func (c PowerSGDConfig) check() error {
	switch {
	case c.Rank < 1:
		return fmt.Errorf("ddp: NewPowerSGDState: Rank %d: need at least 1 (start from DefaultPowerSGDConfig): %w", c.Rank, ErrInvalidArgument)
	case c.StartIter < 0:
		return fmt.Errorf("ddp: NewPowerSGDState: StartIter %d is negative: %w", c.StartIter, ErrInvalidArgument)
	case !(c.MinCompressionRate >= 1):
		return fmt.Errorf("ddp: NewPowerSGDState: MinCompressionRate %v: need at least 1 (start from DefaultPowerSGDConfig): %w", c.MinCompressionRate, ErrInvalidArgument)
	case !(c.Epsilon >= 0):
		return fmt.Errorf("ddp: NewPowerSGDState: Epsilon %v: need a number of at least 0: %w", c.Epsilon, ErrInvalidArgument)
	case (c.ErrorFeedback || c.WarmStart) && c.StartIter < 2:
		return fmt.Errorf("ddp: NewPowerSGDState: error feedback or warm start needs StartIter >= 2 (got %d): the buckets are rebuilt after the first step: %w", c.StartIter, ErrInvalidArgument)
	}
	return nil
}

// NewPowerSGDState returns the state for PowerSGDHook reducing over pg (nil:
// the DDP's group) with the settings of cfg.
func NewPowerSGDState(pg *comm.ProcessGroup, cfg PowerSGDConfig) (*PowerSGDState, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &PowerSGDState{group: pg, rank: cfg.Rank, startIter: cfg.StartIter, minRate: cfg.MinCompressionRate,
		feedback: cfg.ErrorFeedback, warmStart: cfg.WarmStart, epsilon: cfg.Epsilon, seed: cfg.Seed,
		rng:  rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
		errs: map[int][]float64{}, qs: map[int][]float64{}}, nil
}

// Iter returns the number of steps the hook has seen.
func (s *PowerSGDState) Iter() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.iter
}

// CompressionRate returns the number of gradient elements seen divided by the
// number sent, over all compressed steps so far (0 before the first).
func (s *PowerSGDState) CompressionRate() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.numelAfter == 0 {
		return 0
	}
	return float64(s.numelBefore) / float64(s.numelAfter)
}

// PowerSGDHook is PyTorch's powerSGD_hook: for the first StartIter
// steps it behaves as AllReduceHook; afterwards each gradient matrix M
// (n×m, the parameter's first axis by the rest) that compresses well enough
// is replaced by a rank-r approximation P·Qᵀ found by one step of power
// iteration: P = M·Q (all-reduced, then orthogonalized), Q = Mᵀ·P
// (all-reduced, divided by the world size), so only (n+m)·r numbers per
// matrix cross the network. Gradients that do not compress well (vectors,
// small matrices) are all-reduced as they are, in one buffer. With error
// feedback the difference between what this rank put in and what came back
// is added to the bucket in the next step.
//
// The all-reduce of the uncompressed gradients and of P start in the hook
// call; the one of Q starts in the Future's Wait, after the backward pass.
// The arithmetic is done in float64 whatever the bucket's dtype, and
// collectives carry the bucket's dtype.
func PowerSGDHook(ctx context.Context, st *PowerSGDState, b *GradBucket) Future {
	if st == nil {
		return Failed(fmt.Errorf("ddp: PowerSGDHook needs a *PowerSGDState from NewPowerSGDState: %w", ErrInvalidArgument))
	}
	pg := st.group
	if pg == nil {
		pg = b.Group()
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.iter < st.startIter {
		if b.IsLast() {
			st.iter++
		}
		return AllReduceHook(ctx, pg, b)
	}
	c, err := st.compress(ctx, pg, b)
	if err != nil {
		return Failed(err)
	}
	return c
}

// psgdMatrix is one gradient compressed as P·Qᵀ.
type psgdMatrix struct {
	off, n, m, r int // offset in the bucket, rows, columns, rank
	p, q         int // offsets in the P and Q buffers
}

// psgdCall is one bucket's compression in flight.
type psgdCall struct {
	st        *PowerSGDState
	pg        *comm.ProcessGroup
	b         *GradBucket
	input     []float64 // the bucket (plus fed-back error), float64
	before    []float64 // copy of input, for the error
	mats      []psgdMatrix
	plain     [][2]int // uncompressed gradients: offset, length
	plainBuf  *tensor.Dense
	plainWork comm.Work
	pBuf      *tensor.Dense
	pWork     comm.Work
	ps, qs    []float64
}

func (st *PowerSGDState) compress(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) (*psgdCall, error) {
	buf := b.Buffer()
	dt := buf.Dtype()
	numel := buf.Shape().TotalSize()
	c := &psgdCall{st: st, pg: pg, b: b, input: toFloat64s(buf)}
	bi := b.Index()
	if st.feedback {
		e := st.errs[bi]
		if len(e) == numel {
			for i := range c.input {
				c.input[i] += e[i]
			}
		}
		c.before = append([]float64(nil), c.input...)
	}
	var plainLen, pLen, qLen int
	for k, g := range b.Gradients() {
		off := b.Offsets()[k]
		size := g.Shape().TotalSize()
		sh := g.Shape()
		if len(sh) >= 2 {
			n := sh[0]
			m := size / n
			r := min(n, m, st.rank)
			st.numelBefore += int64(size)
			if float64((n+m)*r)*st.minRate < float64(n*m) {
				c.mats = append(c.mats, psgdMatrix{off: off, n: n, m: m, r: r, p: pLen, q: qLen})
				pLen += n * r
				qLen += m * r
				st.numelAfter += int64((n + m) * r)
				continue
			}
		} else {
			st.numelBefore += int64(size)
		}
		st.numelAfter += int64(size)
		c.plain = append(c.plain, [2]int{off, size})
		plainLen += size
	}
	if plainLen > 0 {
		c.plainBuf = tensor.New(tensor.Of(dt), tensor.WithShape(plainLen))
		flat := make([]float64, 0, plainLen)
		for _, pl := range c.plain {
			flat = append(flat, c.input[pl[0]:pl[0]+pl[1]]...)
		}
		fromFloat64s(c.plainBuf, flat)
		c.plainWork = pg.AllReduce(ctx, c.plainBuf, comm.Sum)
	}
	if pLen > 0 {
		q := st.qs[bi]
		fresh := !st.warmStart || len(q) != qLen
		if fresh {
			q = make([]float64, qLen)
			rng := rand.New(rand.NewPCG(st.rng.Uint64(), 0))
			for i := range q {
				q[i] = rng.NormFloat64()
			}
		}
		for _, mt := range c.mats {
			orthogonalize(q[mt.q:mt.q+mt.m*mt.r], mt.m, mt.r, st.epsilon)
		}
		c.qs = q
		c.ps = make([]float64, pLen)
		for _, mt := range c.mats {
			// P = M·Q: [n,m]·[m,r]
			gemm(false, false, mt.n, mt.r, mt.m, c.input[mt.off:mt.off+mt.n*mt.m], mt.m, q[mt.q:mt.q+mt.m*mt.r], mt.r, c.ps[mt.p:mt.p+mt.n*mt.r], mt.r)
		}
		c.pBuf = tensor.New(tensor.Of(dt), tensor.WithShape(pLen))
		fromFloat64s(c.pBuf, c.ps)
		c.pWork = pg.AllReduce(ctx, c.pBuf, comm.Sum)
	}
	b.CountSent(int64(plainLen+pLen+qLen) * int64(dt.Size()))
	return c, nil
}

// Wait finishes the bucket: the plain gradients' average, the P round's
// orthogonalization, the Q round and the decompression.
func (c *psgdCall) Wait(ctx context.Context) (*tensor.Dense, error) {
	st := c.st
	n := float64(c.pg.Size())
	out := c.input
	if c.plainWork != nil {
		if err := c.plainWork.Wait(ctx); err != nil {
			return nil, fmt.Errorf("ddp: PowerSGD: all-reducing uncompressed gradients: %w", err)
		}
		flat := toFloat64s(c.plainBuf)
		k := 0
		for _, pl := range c.plain {
			for i := 0; i < pl[1]; i++ {
				out[pl[0]+i] = flat[k] / n
				k++
			}
		}
	}
	if c.pWork != nil {
		if err := c.pWork.Wait(ctx); err != nil {
			return nil, fmt.Errorf("ddp: PowerSGD: all-reducing P: %w", err)
		}
		ps := toFloat64s(c.pBuf)
		for _, mt := range c.mats {
			orthogonalize(ps[mt.p:mt.p+mt.n*mt.r], mt.n, mt.r, st.epsilon)
			// Q = Mᵀ·P: [m,n]·[n,r]
			gemm(true, false, mt.m, mt.r, mt.n, c.input[mt.off:mt.off+mt.n*mt.m], mt.m, ps[mt.p:mt.p+mt.n*mt.r], mt.r, c.qs[mt.q:mt.q+mt.m*mt.r], mt.r)
		}
		qBuf := tensor.New(tensor.Of(c.pBuf.Dtype()), tensor.WithShape(len(c.qs)))
		fromFloat64s(qBuf, c.qs)
		if err := c.pg.AllReduce(ctx, qBuf, comm.Sum).Wait(ctx); err != nil {
			return nil, fmt.Errorf("ddp: PowerSGD: all-reducing Q: %w", err)
		}
		qs := toFloat64s(qBuf)
		for i := range qs {
			qs[i] /= n
		}
		for _, mt := range c.mats {
			// M ≈ P·Qᵀ: [n,r]·[r,m]
			gemm(false, true, mt.n, mt.m, mt.r, ps[mt.p:mt.p+mt.n*mt.r], mt.r, qs[mt.q:mt.q+mt.m*mt.r], mt.r, out[mt.off:mt.off+mt.n*mt.m], mt.m)
		}
		c.qs = qs
	}
	st.mu.Lock()
	bi := c.b.Index()
	if st.feedback {
		e := make([]float64, len(out))
		for i := range e {
			e[i] = c.before[i] - out[i]
		}
		st.errs[bi] = e
	}
	if st.warmStart && c.qs != nil {
		st.qs[bi] = c.qs
	} else {
		delete(st.qs, bi)
	}
	if c.b.IsLast() {
		st.iter++
	}
	st.mu.Unlock()
	fromFloat64s(c.b.Buffer(), out)
	return c.b.Buffer(), nil
}

// orthogonalize makes the columns of the rows×cols row-major matrix a
// orthonormal, by modified Gram-Schmidt as PyTorch's PowerSGD does (a zero
// column stays zero).
func orthogonalize(a []float64, rows, cols int, eps float64) {
	for i := 0; i < cols; i++ {
		norm := 0.0
		for k := 0; k < rows; k++ {
			norm += a[k*cols+i] * a[k*cols+i]
		}
		norm = math.Sqrt(norm) + eps
		if norm == 0 {
			continue
		}
		for k := 0; k < rows; k++ {
			a[k*cols+i] /= norm
		}
		for j := i + 1; j < cols; j++ {
			dot := 0.0
			for k := 0; k < rows; k++ {
				dot += a[k*cols+i] * a[k*cols+j]
			}
			for k := 0; k < rows; k++ {
				a[k*cols+j] -= dot * a[k*cols+i]
			}
		}
	}
}

// gemm computes c = op(a)·op(b) for row-major matrices, c being m×n and the
// inner dimension k.
func gemm(transA, transB bool, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	ta, tb := blas.NoTrans, blas.NoTrans
	ar, ac := m, k
	if transA {
		ta, ar, ac = blas.Trans, k, m
	}
	br, bc := k, n
	if transB {
		tb, br, bc = blas.Trans, n, k
	}
	blas64.Gemm(ta, tb, 1,
		blas64.General{Rows: ar, Cols: ac, Stride: lda, Data: a},
		blas64.General{Rows: br, Cols: bc, Stride: ldb, Data: b},
		0, blas64.General{Rows: m, Cols: n, Stride: ldc, Data: c})
}

func toFloat64s(t *tensor.Dense) []float64 {
	switch t.Dtype() {
	case tensor.Float64:
		return append([]float64(nil), t.Float64s()...)
	case tensor.Float32:
		d := t.Float32s()
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out
	}
	panic(fmt.Sprintf("ddp: PowerSGD on dtype %v", t.Dtype()))
}

func fromFloat64s(t *tensor.Dense, v []float64) {
	switch t.Dtype() {
	case tensor.Float64:
		copy(t.Float64s(), v)
	case tensor.Float32:
		d := t.Float32s()
		for i, x := range v {
			d[i] = float32(x)
		}
	}
}
