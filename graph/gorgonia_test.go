package graph

import (
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestGorgoniaInternals pins what gorgonia.go reads of gorgonia's unexported
// types against the gorgonia in go.mod: the ops of Set and Read are
// recognised (and nothing else is), Read's destination is the pointer given
// to gorgonia.Read, and the gradient of Slice is the op that adds into its
// buffer. An upgrade of gorgonia that renames or reshapes any of them fails
// here.
func TestGorgoniaInternals(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 2), G.WithName("x"), G.WithInit(G.RangedFrom(0)))
	y := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 2), G.WithName("y"), G.WithInit(G.Zeroes()))
	sum := G.Must(G.Add(x, y))
	set := G.Set(y, sum)
	var out G.Value
	read := G.Read(sum, &out)
	row := G.Must(G.Slice(x, G.S(1)))
	cost := G.Must(G.Sum(row))
	if _, err := G.Grad(cost, x); err != nil {
		t.Fatal(err)
	}

	if !isLetOp(set.Op()) || isReadOp(set.Op()) {
		t.Errorf("the op of gorgonia.Set (%T) is not recognised as a let statement", set.Op())
	}
	if !isReadOp(read.Op()) || isLetOp(read.Op()) {
		t.Errorf("the op of gorgonia.Read (%T) is not recognised as a read statement", read.Op())
	}
	if into := readTarget(read.Op()); into != &out {
		t.Errorf("readTarget = %p, want the pointer given to gorgonia.Read (%p)", into, &out)
	}
	if isLetOp(sum.Op()) || isReadOp(sum.Op()) || readTarget(sum.Op()) != nil {
		t.Errorf("the op of Add (%T) is taken for a statement", sum.Op())
	}

	var incr int
	for _, n := range g.AllNodes() {
		if n.Op() != nil && accumulatesIntoPrealloc(n.Op()) {
			incr++
		}
	}
	if incr != 1 {
		t.Errorf("found %d ops that add into their buffer, want 1 (the gradient of Slice)", incr)
	}
	if accumulatesIntoPrealloc(row.Op()) {
		t.Errorf("Slice (%T) is taken for its gradient", row.Op())
	}

	// The program built on these recognitions runs: Read copies the sum out.
	p, err := Compile(g, Workers(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if out == nil || out.Data().([]float64)[5] != 5 {
		t.Errorf("gorgonia.Read wrote %v, want x+0", out)
	}
}
