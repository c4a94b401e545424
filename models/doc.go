// Package models holds neural-network layers and ready models that match
// PyTorch's torch.nn: the same parameter names, shapes, state_dict order and
// default initialisation, so weights move between the two through
// safetensors checkpoints (package checkpoint) and optimizers reproduce
// PyTorch's trajectories.
//
// A Module owns Params (learnable tensors) and Buffers (running statistics)
// as *Param values whose Value tensors it keeps for its whole life, and
// builds its computation into a gorgonia graph on demand through a Builder.
// The Builder binds each Param's Value to one graph node, so an optimizer
// updating Value in place changes the next run without rebuilding the graph:
//
//	model, _ := models.NewMLP([]int{784, 256, 10}, models.WithRand(rand.New(rand.NewPCG(1, 2))))
//	b := models.NewBuilder(nil)                 // a new graph, training mode
//	x := b.Bind("x", xBatch)                    // refill xBatch in place per step
//	y := b.Bind("y", labels)                    // int64 class indices [N]
//	logits, _ := model.Forward(b, x)
//	loss, _ := models.CrossEntropy(logits, y)
//	_ = b.Backward(loss)                        // gradient nodes for every parameter
//	vm := gorgonia.NewTapeMachine(b.Graph())    // or the graph package's executor
//	_ = vm.RunAll()
//	_ = b.CopyGrads()                           // Param.Grad now holds dLoss/dParam
//
// Layers: Linear, Conv2d, MaxPool2d, Flatten, ReLU, Tanh, GELU, Dropout,
// Embedding, LayerNorm, BatchNorm2d, Sequential (children "0", "1", ...) and
// NewNamedSequential (named children); losses CrossEntropy and MSE; models
// NewMLP and NewCNN. Dropout and BatchNorm2d follow the Builder's Mode
// (Train by default, WithMode(Eval)). Tensors are float32 by default, as in
// PyTorch; WithDtype(tensor.Float64) builds any layer or model in float64. Ops gorgonia lacks or gets subtly different from PyTorch are
// custom gorgonia ops with exact, hand-written backward rules.
//
// A model Tandem does not ship is a struct that embeds Container, makes its
// tensors with NewParam (and NewBuffer) from torch.nn.init's initializers
// (FanInUniform, KaimingUniform, XavierUniform, Normal, Zeros, ...), registers
// them and its child layers with AddParam and AddChild, and writes Forward:
// its state_dict names are PyTorch's for the same module ("mix",
// "query.weight"), so checkpoints and DDP treat it as they treat NewMLP (see
// Example_customModule). NameChild is the renaming underneath, for
// containers written without Container. A Module has one Forward input; a
// model of several inputs adds its own method for them and builds the loss
// from graph nodes, as that example does.
//
// Speed. The ops write into the buffers an executor keeps between runs
// (gorgonia.UsePreallocDoer), so a training step allocates next to nothing
// under the graph package's executor. Backward builds no gradient for a
// bound input batch; Sequential runs a Linear or Conv2d followed by a ReLU
// as one bias+ReLU pass; Conv2d is one GEMM per sample. Matrix products go
// through internal/blas: build with -tags openblas for OpenBLAS, which is
// several times faster than the pure-Go default. WithGradsInPlace makes
// the runs of a program compiled with Builder.Compile write gradients
// straight into Param.Grad (read its contract first); where a gradient goes
// is the executor's to decide (graph.Program.SetOutput), not the op's.
package models
