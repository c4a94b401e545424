package rpc

import (
	"context"
	"testing"

	"gorgonia.org/tensor"
)

func registerSum(rank int, reg *Registry) {
	registerBasics(rank, reg)
	must(Register(reg, "sum", func(ctx context.Context, x *tensor.Dense) (float64, error) {
		var s float64
		for _, v := range x.Data().([]float32) {
			s += float64(v)
		}
		return s, nil
	}))
}

func TestSameHostCopy(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			agents := startGroup(t, 2, registerSum, WithSameHostCopy(on))
			ctx := context.Background()
			n := cmaThreshold/4 + 1 // just over the threshold
			data := make([]float32, n)
			for i := range data {
				data[i] = float32(i % 1000)
			}
			x := dense([]int{n}, data)
			y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
			if err != nil {
				t.Fatal(err)
			}
			if !sameTensor(x, y) {
				t.Fatal("echo changed the tensor")
			}
			c := agents[0].peers[1].cur.Load()
			if want := on && cmaSupported && bootID != ([16]byte{}); c.sendByRef != want || c.recvByRef != want {
				t.Fatalf("same-host copies on the connection: send %v recv %v, want %v", c.sendByRef, c.recvByRef, want)
			}
			if copies := agents[0].Metrics().SameHostCopies + agents[1].Metrics().SameHostCopies; (copies >= 2) != on {
				t.Fatalf("%d same-host copies with them %v", copies, map[bool]string{true: "on", false: "off"}[on])
			}
			// The caller may change the tensor as soon as Async returns.
			var want float64
			for _, v := range data {
				want += float64(v)
			}
			f := Async[float64](ctx, agents[0], "w1", "sum", x)
			for i := range data {
				data[i] = -1
			}
			if got, err := f.Wait(ctx); err != nil || got != want {
				t.Fatalf("sum: %v %v, want %v", got, err, want)
			}
			// Many large calls at once.
			var futs []*Future[*tensor.Dense]
			for i := 0; i < 8; i++ {
				futs = append(futs, Async[*tensor.Dense](ctx, agents[1], "w0", "echo", x))
			}
			for _, f := range futs {
				if y, err := f.Wait(ctx); err != nil || !sameTensor(x, y) {
					t.Fatalf("concurrent echo: %v", err)
				}
			}
		})
	}
}
