package models_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// A training loop whose Linear weights are updated inside the backward
// pass: the program updates them itself, and optim.SGD gets only the
// parameters the program leaves to it (the biases).
func ExampleWithSGDInBackward() {
	model, _ := models.NewMLP([]int{2, 8, 2}, models.WithRand(rand.New(rand.NewPCG(1, 2))), models.WithDtype(tensor.Float64))
	x := tensor.New(tensor.WithShape(4, 2), tensor.WithBacking([]float64{0, 0, 0, 1, 1, 0, 1, 1}))
	y := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{0, 1, 1, 0}))

	const lr = 0.2
	b := models.NewBuilder(nil, models.WithGradsInPlace(), models.WithSGDInBackward(lr))
	logits, _ := model.Forward(b, b.Bind("x", x))
	loss, _ := models.CrossEntropy(logits, b.Bind("y", y))
	_ = b.Backward(loss)
	prog, err := b.Compile(graph.Workers(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	fused, rest := b.SGDInBackward()
	opt, _ := optim.NewSGD(rest, optim.LR(lr))
	var first, last float64
	for step := 0; step < 300; step++ {
		opt.ZeroGrad()
		if err := prog.Run(context.Background()); err != nil {
			fmt.Println(err)
			return
		}
		_ = b.CopyGrads()
		_ = opt.Step()
		l := loss.Value().Data().(float64)
		if step == 0 {
			first = l
		}
		last = l
	}
	fmt.Println(len(fused), "weights updated by the run,", len(rest), "biases by optim.SGD")
	fmt.Println(last < first/4)
	// Output:
	// 2 weights updated by the run, 2 biases by optim.SGD
	// true
}
