package graph

import (
	"context"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestSliceGradStableAcrossRuns: the gradient of a Slice is computed by an
// op that adds into whatever buffer it is given; with buffer reuse it must
// still be the same on every run, not grow by one gradient a run.
func TestSliceGradStableAcrossRuns(t *testing.T) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 2), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))))
	c := G.Must(G.Sum(G.Must(G.Slice(x, G.S(0)))))
	grads, err := G.Grad(c, x)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := Compile(g, WithGrads(G.Nodes{x}, grads))
	if err != nil {
		t.Fatal(err)
	}
	for run := 0; run < 3; run++ {
		if err := prog.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		v, err := prog.Grad(x)
		if err != nil {
			t.Fatal(err)
		}
		got := v.Data().([]float64)
		want := []float64{1, 1, 0, 0}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d: grad = %v, want %v", run, got, want)
			}
		}
	}
}
