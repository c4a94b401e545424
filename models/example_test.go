package models_test

import (
	"fmt"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// Train an MLP for a few steps with plain gradient descent on Param.Value.
func Example() {
	model, _ := models.NewMLP([]int{2, 8, 2}, models.WithActivation(models.ActTanh), models.WithRand(rand.New(rand.NewPCG(1, 2))), models.WithDtype(tensor.Float64))
	for _, p := range models.StateDict(model) {
		fmt.Println(p.Name, p.Value.Shape())
	}

	x := tensor.New(tensor.WithShape(4, 2), tensor.WithBacking([]float64{0, 0, 0, 1, 1, 0, 1, 1}))
	y := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{0, 1, 1, 0}))
	b := models.NewBuilder(nil)
	logits, _ := model.Forward(b, b.Bind("x", x))
	loss, _ := models.CrossEntropy(logits, b.Bind("y", y))
	_ = b.Backward(loss)
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()

	var first, last float64
	for step := 0; step < 200; step++ {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			fmt.Println(err)
			return
		}
		_ = b.CopyGrads()
		l := loss.Value().Data().(float64)
		if step == 0 {
			first = l
		}
		last = l
		for _, p := range model.Params() {
			v, g := p.Value.Float64s(), p.Grad.Float64s()
			for i := range v {
				v[i] -= 0.5 * g[i]
			}
		}
	}
	fmt.Println(last < first/4)
	// Output:
	// 0.weight (8, 2)
	// 0.bias (8)
	// 2.weight (2, 8)
	// 2.bias (2)
	// true
}
