package models_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// A training loop on the graph executor with gradients written in place:
// after each run Param.Grad already holds the gradient, in the same tensor
// every step, and CopyGrads has nothing left to copy.
func ExampleWithGradsInPlace() {
	model, _ := models.NewMLP([]int{2, 8, 2}, models.WithRand(rand.New(rand.NewPCG(1, 2))), models.WithDtype(tensor.Float64))
	x := tensor.New(tensor.WithShape(4, 2), tensor.WithBacking([]float64{0, 0, 0, 1, 1, 0, 1, 1}))
	y := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{0, 1, 1, 0}))

	b := models.NewBuilder(nil, models.WithGradsInPlace())
	logits, _ := model.Forward(b, b.Bind("x", x))
	loss, _ := models.CrossEntropy(logits, b.Bind("y", y))
	_ = b.Backward(loss)                     // allocates every Param.Grad
	prog, err := b.Compile(graph.Workers(1)) // points the program at every Param.Grad
	if err != nil {
		fmt.Println(err)
		return
	}
	w := model.Params()[0]
	grad := w.Grad
	var first, last float64
	for step := 0; step < 300; step++ {
		if err := prog.Run(context.Background()); err != nil {
			fmt.Println(err)
			return
		}
		_ = b.CopyGrads() // copies only what the run could not write in place
		l := loss.Value().Data().(float64)
		if step == 0 {
			first = l
		}
		last = l
		for _, p := range model.Params() {
			v, g := p.Value.Float64s(), p.Grad.Float64s()
			for i := range v {
				v[i] -= 0.2 * g[i]
			}
		}
	}
	fmt.Println(last < first/4, w.Grad == grad)
	fmt.Println(b.AccumulateGrads() != nil)
	// Output:
	// true true
	// true
}
