package rpc

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorgonia.org/tensor"
)

// bag carries tensors in a map, a slice and an Any: the map's order
// changes from one encoding to the next.
type bag struct {
	Named map[string]*tensor.Dense
	List  []*tensor.Dense
	Extra Any
}

// counted counts its encodings.
type counted struct{ N int }

var encodings atomic.Int64

func (c *counted) MarshalRPC(e *Encoder) error {
	encodings.Add(1)
	e.Uvarint(uint64(c.N))
	return nil
}

func (c *counted) UnmarshalRPC(d *Decoder) error {
	n, err := d.Uvarint()
	c.N = int(n)
	return err
}

type countedBag struct {
	B bag
	C counted
}

func scalar(v float64) *tensor.Dense {
	return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{v}))
}

func newBag(base float64) bag {
	b := bag{Named: map[string]*tensor.Dense{}}
	for i := range 12 {
		b.Named[fmt.Sprint("k", i)] = scalar(base + float64(i))
	}
	b.List = []*tensor.Dense{scalar(base + 100), b.Named["k3"]}
	b.Extra = AnyOf([]*tensor.Dense{scalar(base + 200)})
	return b
}

// values lists the tensors' values.
func values(ts []*tensor.Dense) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = fmt.Sprint(t.Data().([]float64)[0])
	}
	return strings.Join(s, ",")
}

// TestTensorLists: the caller's ClientCall.Tensors and the callee's
// ServerCall.Tensors list an argument's tensors in the same order, as do
// ServerCall.ResultTensors and Response.Tensors for the result, maps and
// Any included; each tensor once; and the value is encoded once, although
// an interceptor asked for its tensors before it went.
func TestTensorLists(t *testing.T) {
	client := func(ctx context.Context, c *ClientCall, next Invoker) *Future[*Response] {
		ts, err := c.Tensors()
		if err != nil {
			return Ready[*Response](nil, err)
		}
		c.Meta = Metadata{"sent": values(ts)}
		return Then(next(ctx, c), func(r *Response, err error) (*Response, error) {
			if err == nil && values(r.Tensors) != r.Meta["result"] {
				err = fmt.Errorf("result tensors %s, callee sent %s", values(r.Tensors), r.Meta["result"])
			}
			return r, err
		})
	}
	server := func(ctx context.Context, c *ServerCall, next Handler) *Future[any] {
		if got := values(c.Tensors()); got != c.Meta["sent"] {
			return Ready[any](nil, fmt.Errorf("argument tensors %s, caller sent %s", got, c.Meta["sent"]))
		}
		return Then(next(ctx, c), func(v any, err error) (any, error) {
			if err != nil {
				return v, err
			}
			ts, err := c.ResultTensors(v)
			c.ReplyMeta = Metadata{"result": values(ts)}
			return v, err
		})
	}
	agents := startGroup(t, 2, func(rank int, reg *Registry) {
		must(Register(reg, "swap", func(ctx context.Context, b countedBag) (countedBag, error) {
			out := newBag(1000)
			for k, v := range b.B.Named {
				out.Named[k+"'"] = v
			}
			return countedBag{B: out, C: counted{N: b.C.N + 1}}, nil
		}))
	}, WithClientInterceptor(client), WithServerInterceptor(server))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 5 {
		encodings.Store(0)
		arg := countedBag{B: newBag(float64(10 * i)), C: counted{N: i}}
		res, err := Sync[countedBag](ctx, agents[0], "w1", "swap", arg)
		if err != nil {
			t.Fatal(err)
		}
		if res.C.N != i+1 || len(res.B.Named) != 24 {
			t.Fatalf("result %+v", res)
		}
		if n := encodings.Load(); n != 2 {
			t.Fatalf("%d encodings of the argument and the result, want one each", n)
		}
	}
	// The lists hold each tensor once, in the order the encoder meets them.
	x, y := scalar(1), scalar(2)
	c := &ClientCall{To: agents[0].Self(), Arg: bag{List: []*tensor.Dense{x, y, x}, Extra: AnyOf(y)}, agent: agents[0]}
	ts, err := c.Tensors()
	if err != nil || len(ts) != 2 || ts[0] != x || ts[1] != y {
		t.Fatalf("tensors of a call: %v %v", ts, err)
	}
	c.pre.drop()
}

// TestTensorsThenNewArg: an interceptor that asks for the tensors and then
// replaces the argument sends the new one; the first encoding is undone
// (what its Marshalers registered runs OnUnsent), never sent.
func TestTensorsThenNewArg(t *testing.T) {
	var undone atomic.Int64
	client := func(ctx context.Context, c *ClientCall, next Invoker) *Future[*Response] {
		if _, err := c.Tensors(); err != nil {
			return Ready[*Response](nil, err)
		}
		c.Arg = scalar(5)
		return next(ctx, c)
	}
	agents := startGroup(t, 2, registerBasics, WithClientInterceptor(client))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	arg := unsentProbe{T: scalar(1), undone: &undone}
	got, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", arg)
	if err != nil {
		t.Fatal(err)
	}
	if v := got.Data().([]float64)[0]; v != 5 {
		t.Fatalf("echoed %v, want the replaced argument 5", v)
	}
	if undone.Load() != 1 {
		t.Fatalf("the first encoding was undone %d times, want once", undone.Load())
	}
}

// unsentProbe registers an OnUnsent function when encoded.
type unsentProbe struct {
	T      *tensor.Dense
	undone *atomic.Int64
}

func (p *unsentProbe) MarshalRPC(e *Encoder) error {
	e.OnUnsent(func() { p.undone.Add(1) })
	return e.Tensor(p.T)
}

func (p *unsentProbe) UnmarshalRPC(d *Decoder) error {
	var err error
	p.T, err = d.Tensor()
	return err
}
