package graph

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// probeOp is a unary test op: it returns a copy of its input after calling
// its behaviour function (which may block, fail or panic). Each instance has
// its own name so gorgonia does not merge two nodes using different probes.
type probeOp struct {
	name string
	do   func(ctx context.Context) error
}

func (op *probeOp) Arity() int { return 1 }
func (op *probeOp) Type() hm.Type {
	return hm.NewFnType(hm.TypeVariable('a'), hm.TypeVariable('a'))
}
func (op *probeOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	return ds[0].(tensor.Shape).Clone(), nil
}
func (op *probeOp) ReturnsPtr() bool     { return false }
func (op *probeOp) CallsExtern() bool    { return false }
func (op *probeOp) OverwritesInput() int { return -1 }
func (op *probeOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "probe:%s", op.name)
}
func (op *probeOp) Hashcode() uint32 {
	h := fnvHash()
	op.WriteHash(h)
	return h.Sum32()
}
func (op *probeOp) String() string { return "probe:" + op.name }
func (op *probeOp) Do(in ...G.Value) (G.Value, error) {
	if op.do != nil {
		if err := op.do(context.Background()); err != nil {
			return nil, err
		}
	}
	return G.CloneValue(in[0])
}

// ctxProbeOp is a probeOp whose behaviour sees the run's context. It writes
// its result into the preallocated value when it gets one, and remembers
// what it got.
type ctxProbeOp struct {
	probeOp
	prealloc []G.Value
}

func (op *ctxProbeOp) DoContext(ctx context.Context, prealloc G.Value, in ...G.Value) (G.Value, error) {
	op.prealloc = append(op.prealloc, prealloc)
	if op.do != nil {
		if err := op.do(ctx); err != nil {
			return nil, err
		}
	}
	if prealloc != nil {
		return G.Copy(prealloc, in[0])
	}
	return G.CloneValue(in[0])
}

func probe(x *G.Node, op G.Op) *G.Node { return G.Must(G.ApplyOp(op, x)) }

// rendezvous lets n callers pass only when all n are inside at once; a caller
// alone gives up after the timeout with an error.
type rendezvous struct {
	mu      sync.Mutex
	arrived int
	n       int
	all     chan struct{}
	timeout time.Duration
}

func newRendezvous(n int, timeout time.Duration) *rendezvous {
	return &rendezvous{n: n, all: make(chan struct{}), timeout: timeout}
}

var errAlone = errors.New("no concurrent partner arrived")

func (r *rendezvous) wait(ctx context.Context) error {
	r.mu.Lock()
	r.arrived++
	if r.arrived == r.n {
		close(r.all)
	}
	r.mu.Unlock()
	t := time.NewTimer(r.timeout)
	defer t.Stop()
	select {
	case <-r.all:
		return nil
	case <-t.C:
		return errAlone
	case <-ctx.Done():
		return ctx.Err()
	}
}

// concurrency tracks how many callers are inside at once.
type concurrency struct {
	now, max atomic.Int32
}

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			break
		}
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

func fnvHash() hash.Hash32 { return fnv.New32a() }

// scaleOp multiplies its input by *factor. Like some real ops it returns its
// input itself when there is nothing to do (factor 1), and it supports
// writing into a preallocated result.
type scaleOp struct{ factor *float64 }

func (op scaleOp) Arity() int { return 1 }
func (op scaleOp) Type() hm.Type {
	return hm.NewFnType(hm.TypeVariable('a'), hm.TypeVariable('a'))
}
func (op scaleOp) InferShape(ds ...G.DimSizer) (tensor.Shape, error) {
	return ds[0].(tensor.Shape).Clone(), nil
}
func (op scaleOp) ReturnsPtr() bool      { return true }
func (op scaleOp) CallsExtern() bool     { return false }
func (op scaleOp) OverwritesInput() int  { return -1 }
func (op scaleOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "scale%p", op.factor) }
func (op scaleOp) Hashcode() uint32 {
	h := fnvHash()
	op.WriteHash(h)
	return h.Sum32()
}
func (op scaleOp) String() string { return "scale" }
func (op scaleOp) Do(in ...G.Value) (G.Value, error) {
	if *op.factor == 1 {
		return in[0], nil
	}
	return tensor.Mul(in[0].(tensor.Tensor), *op.factor)
}
func (op scaleOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	dst := prealloc.(*tensor.Dense).Float64s()
	src := in[0].(*tensor.Dense).Float64s()
	if len(dst) != len(src) {
		return nil, fmt.Errorf("prealloc has %d elements, input %d", len(dst), len(src))
	}
	for i, v := range src {
		dst[i] = v * *op.factor
	}
	return prealloc, nil
}
