package models

import "gorgonia.org/tensor"

// Param is one named tensor of a module's state: a learnable parameter or a
// buffer (running statistics). Name follows PyTorch's state_dict naming
// ("0.weight", "conv1.bias", "bn.running_mean"). Value is updated in place by
// optimizers and by DDP's broadcast, so graphs built over it see new values
// without being rebuilt. Grad holds the parameter's gradient after a backward
// pass (nil before the first one, and for buffers).
type Param struct {
	Name         string
	Value        *tensor.Dense
	Grad         *tensor.Dense
	RequiresGrad bool
}
