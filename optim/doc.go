// Package optim updates model parameters from their gradients with PyTorch's
// update rules, reproduced to the last bit that float64 allows.
//
// An [Optimizer] is built over the []*models.Param of a model. Each call to
// Step reads every parameter's Grad and updates its Value in place; parameters
// whose Grad is nil are skipped, as torch.optim skips parameters whose .grad is
// None, and their per-parameter state is created lazily on the first step that
// sees a gradient.
//
//	opt, err := optim.NewSGD(model.Params(), optim.LR(0.1), optim.Momentum(0.9), optim.WeightDecay(1e-4))
//	for step := range steps {
//		opt.ZeroGrad()
//		// forward and backward fill every Param.Grad
//		if err := opt.Step(); err != nil { ... }
//	}
//
// Three optimizers exist: [SGD] (momentum, dampening, Nesterov, weight decay,
// maximize), [Adam] (betas, eps, L2 weight decay, AMSGrad, maximize) and AdamW
// (Adam with decoupled weight decay, built by [NewAdamW]). [New] builds any of
// them from torch.optim's keyword arguments, as they appear in a JSON config
// or in the golden files under testdata. All three take every hyperparameter,
// the learning rate included, as an [Option] (LR, Momentum, Betas,
// WeightDecay, ...): an option that does not apply to the optimizer is
// refused rather than ignored, and SGD requires LR, as torch 1.13's SGD
// requires lr.
//
// # Exactness
//
// The updates follow torch.optim 1.13's single-tensor implementation operation
// by operation and fuse the per-tensor passes into one loop per parameter,
// which changes nothing element-wise. Three facts about how torch's CPU kernels
// round make the results bit-identical to the golden files made on an x86-64
// machine with AVX2:
//
//   - an add with a scale factor (tensor.add_(other, alpha=a), and therefore
//     weight decay, momentum and Nesterov terms) rounds once, as a fused
//     multiply-add a*other+self; so does addcmul's last multiply-add;
//   - beta**step in the bias corrections is C's pow, which is correctly
//     rounded; Go's math.Pow is not, so this package raises to integer powers
//     in double-double arithmetic and rounds once;
//   - addcdiv computes self + (value*t1)/t2, two roundings before the add.
//
// On float32 tensors every scalar is first rounded to float32, as torch does,
// and a fused multiply-add rounds once, as the hardware's does.
//
// # Speed
//
// On amd64 processors with AVX and FMA3, the float32 updates of SGD (plain,
// momentum, weight decay) and of Adam (with or without L2 weight decay) and
// AdamW run in vector kernels, eight
// elements an instruction, with the same operations in the same order as the
// portable loops and as torch's: on the development machine SGD takes 0.4
// ms per million parameters, SGD with momentum 0.6 ms and Adam 0.9 ms (go
// test -bench . ./optim), against 1.8, 8.8 and 13 ms for the portable
// loops. The other variants (Nesterov, maximize, AMSGrad, the first
// momentum step), float64, other processors and builds
// with the purego tag run the portable loops; the portable float32 fused
// multiply-add computes in float64 and rounds to odd before rounding to
// float32, which rounds once as the hardware does.
//
// # Zeroing gradients
//
// ZeroGrad writes zeros into every existing Grad tensor and leaves nil grads
// nil. That is torch 1.13's default (zero_grad(set_to_none=False)); it keeps
// gradient buffers at stable addresses, which DDP's buckets rely on. Zeroed
// gradients still take part in the next Step (weight decay and momentum still
// act on them), exactly as in torch with set_to_none=False.
//
// # Checkpoints
//
// State returns the optimizer's state as named tensors laid out like a
// flattened torch optimizer state_dict: "state.<i>.<buffer>" where i indexes
// the parameters in the order given to the constructor and buffer is
// momentum_buffer (SGD) or step, exp_avg, exp_avg_sq and max_exp_avg_sq
// (Adam, AdamW), plus "param_groups.0.lr" holding the current learning rate.
// LoadState takes the same map back.
//
// # Learning-rate schedules
//
// [StepLR] and [CosineAnnealingLR] change an optimizer's learning rate once
// per epoch with PyTorch's recursive (chainable) formulas, so several
// schedulers can act on one optimizer, as in torch.
package optim
