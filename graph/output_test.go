package graph

import (
	"context"
	"errors"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestSetOutput: a node given an output is computed into it run after run,
// by an op that writes into its buffer (scaleOp's UsePreallocDo) and by
// one that cannot (probeOp, whose result the executor copies); a kept
// buffer of another node that the output overlaps is dropped before the
// run; and once the output is cleared, no run writes into it again.
func TestSetOutput(t *testing.T) {
	for _, workers := range []int{1, 3} {
		g := G.NewGraph()
		xv := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))
		x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"), G.WithValue(xv))
		two, three := 2.0, 3.0
		a := G.Must(G.ApplyOp(scaleOp{&two}, x))
		b := probe(x, &probeOp{name: "b"})
		c := G.Must(G.ApplyOp(scaleOp{&three}, x))
		p, err := Compile(g, Workers(workers))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// A first run gives c a kept buffer; a's output is then set to that
		// very memory, which the program must stop handing to c.
		if err := p.Run(ctx); err != nil {
			t.Fatal(err)
		}
		cBuf := p.Value(c).(*tensor.Dense)
		da := cBuf
		db := tensor.New(tensor.WithShape(2, 3), tensor.Of(tensor.Float64))
		if err := p.SetOutput(a, da); err != nil {
			t.Fatal(err)
		}
		if err := p.SetOutput(b, db); err != nil {
			t.Fatal(err)
		}
		if p.Output(a) != da || p.Output(b) != db || p.Output(c) != nil {
			t.Fatal("Output does not return what SetOutput set")
		}
		for run := 0; run < 3; run++ {
			xs := xv.Float64s()
			for i := range xs {
				xs[i] = float64(10*run + i)
			}
			if err := p.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if a.Value() != G.Value(da) || p.Value(a) != G.Value(da) {
				t.Fatalf("workers %d run %d: a's value is not its output", workers, run)
			}
			if b.Value() != G.Value(db) {
				t.Fatalf("workers %d run %d: b's value is not its output (copy path)", workers, run)
			}
			if sameMemory(c.Value(), da) {
				t.Fatalf("workers %d run %d: c still writes into a's output", workers, run)
			}
			for i, v := range xs {
				if got := da.Float64s()[i]; got != 2*v {
					t.Fatalf("workers %d run %d: a[%d] = %v, want %v", workers, run, i, got, 2*v)
				}
				if got := db.Float64s()[i]; got != v {
					t.Fatalf("workers %d run %d: b[%d] = %v, want %v", workers, run, i, got, v)
				}
				if got := c.Value().Data().([]float64)[i]; got != 3*v {
					t.Fatalf("workers %d run %d: c[%d] = %v, want %v", workers, run, i, got, 3*v)
				}
			}
		}
		// Cleared: the next runs leave the former outputs alone.
		if err := p.SetOutput(a, nil); err != nil {
			t.Fatal(err)
		}
		if err := p.SetOutput(b, nil); err != nil {
			t.Fatal(err)
		}
		oldA, oldB := append([]float64(nil), da.Float64s()...), append([]float64(nil), db.Float64s()...)
		for run := 0; run < 2; run++ {
			xs := xv.Float64s()
			for i := range xs {
				xs[i] = float64(-7*run - i - 1)
			}
			if err := p.Run(ctx); err != nil {
				t.Fatal(err)
			}
			if sameMemory(a.Value(), da) || sameMemory(b.Value(), db) {
				t.Fatalf("workers %d: a cleared output is still written", workers)
			}
			for i := range oldA {
				if da.Float64s()[i] != oldA[i] || db.Float64s()[i] != oldB[i] {
					t.Fatalf("workers %d: a run wrote into a cleared output", workers)
				}
				if got := a.Value().Data().([]float64)[i]; got != 2*xs[i] {
					t.Fatalf("workers %d: a[%d] = %v, want %v", workers, i, got, 2*xs[i])
				}
			}
		}
	}
}

// TestSetOutputRefuses: an output of the wrong shape or dtype, a view, an
// input node and a node of another graph are refused with
// ErrInvalidArgument, and leave the node as it was.
func TestSetOutputRefuses(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"), G.WithInit(G.Zeroes()))
	two := 2.0
	a := G.Must(G.ApplyOp(scaleOp{&two}, x))
	p, err := Compile(g, Workers(1))
	if err != nil {
		t.Fatal(err)
	}
	big := tensor.New(tensor.WithShape(4, 3), tensor.Of(tensor.Float64))
	view, err := big.Slice(G.S(0, 2))
	if err != nil {
		t.Fatal(err)
	}
	other := G.NewGraph()
	y := G.NewMatrix(other, tensor.Float64, G.WithShape(2, 3), G.WithName("y"))
	for name, try := range map[string]func() error{
		"shape": func() error { return p.SetOutput(a, tensor.New(tensor.WithShape(3, 2), tensor.Of(tensor.Float64))) },
		"dtype": func() error { return p.SetOutput(a, tensor.New(tensor.WithShape(2, 3), tensor.Of(tensor.Float32))) },
		"view":  func() error { return p.SetOutput(a, view.(*tensor.Dense)) },
		"input": func() error { return p.SetOutput(x, tensor.New(tensor.WithShape(2, 3), tensor.Of(tensor.Float64))) },
		"graph": func() error { return p.SetOutput(y, tensor.New(tensor.WithShape(2, 3), tensor.Of(tensor.Float64))) },
	} {
		if err := try(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: SetOutput = %v, want ErrInvalidArgument", name, err)
		}
	}
	if p.Output(a) != nil {
		t.Error("a refused output was kept")
	}
}
