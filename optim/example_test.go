package optim_test

import (
	"fmt"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
	"gorgonia.org/tensor"
)

// Minimise f(w) = sum(w^2)/2, whose gradient is w itself, with SGD and
// Nesterov momentum.
func ExampleNewSGD() {
	w := &models.Param{Name: "w", RequiresGrad: true,
		Value: tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, -2}))}
	opt, err := optim.NewSGD([]*models.Param{w}, optim.LR(0.1), optim.Momentum(0.9), optim.Nesterov(true))
	if err != nil {
		panic(err)
	}
	w.Grad = tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{0, 0}))
	for step := 0; step < 100; step++ {
		opt.ZeroGrad()
		copy(w.Grad.Float64s(), w.Value.Float64s()) // "backward"
		if err := opt.Step(); err != nil {
			panic(err)
		}
	}
	fmt.Printf("w = [%.4f %.4f]\n", w.Value.Float64s()[0], w.Value.Float64s()[1])
	// Output: w = [0.0000 -0.0000]
}

// AdamW with a cosine learning-rate schedule stepped once per epoch, and a
// checkpoint of the optimizer's state.
func ExampleNewAdamW() {
	w := &models.Param{Name: "w", RequiresGrad: true,
		Value: tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{0.5, -0.5, 1}))}
	opt, err := optim.NewAdamW([]*models.Param{w}, optim.LR(0.01), optim.WeightDecay(0.1))
	if err != nil {
		panic(err)
	}
	sched, err := optim.NewCosineAnnealingLR(opt, 4, 0.001)
	if err != nil {
		panic(err)
	}
	for epoch := 0; epoch < 4; epoch++ {
		for step := 0; step < 10; step++ {
			w.Grad = tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{0.1, 0.2, -0.3}))
			if err := opt.Step(); err != nil {
				panic(err)
			}
		}
		sched.Step()
		fmt.Printf("epoch %d done, lr now %.6f\n", epoch, opt.LR())
	}
	state := opt.State()
	fmt.Println(state["state.0.step"].Data(), state["state.0.exp_avg"].Shape())
	// Output:
	// epoch 0 done, lr now 0.008682
	// epoch 1 done, lr now 0.005500
	// epoch 2 done, lr now 0.002318
	// epoch 3 done, lr now 0.001000
	// 40 (3)
}

// New builds an optimizer from torch.optim's keyword arguments, as they come
// out of a JSON config.
func ExampleNew() {
	w := &models.Param{Name: "w", Value: tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{1}))}
	opt, err := optim.New("adam", []*models.Param{w}, map[string]any{
		"lr": 0.1, "betas": []any{0.9, 0.99}, "amsgrad": true,
	})
	if err != nil {
		panic(err)
	}
	w.Grad = tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{2}))
	_ = opt.Step()
	fmt.Printf("%.4f\n", w.Value.Float64s()[0])

	_, err = optim.New("adam", []*models.Param{w}, map[string]any{"momentum": 0.9})
	fmt.Println(err)
	// Output:
	// 0.9000
	// optim: adam: unknown setting "momentum" (accepted: lr, betas, eps, weight_decay, amsgrad, maximize, foreach, capturable, differentiable, fused): tandem: invalid argument
}
