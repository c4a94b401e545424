// Package cudamlp is the float32 training step of an MLP (Linear layers,
// ReLU between them, softmax cross-entropy, SGD) with its parameters,
// gradients, activations and optimizer on a CUDA GPU: the products through
// cuBLAS (internal/cudablas), the element-wise passes (ReLU, its gradient,
// the loss and its gradient) as CUDA kernels compiled to PTX by NVRTC when
// a Step is made, everything queued on the device's stream, so that the
// gradients can be staged for an all-reduce (comm/devstage) straight after
// the backward pass.
//
// The gradients live in one device buffer (GradBuffer), which
// AllReduceGrads averages across a process group through a
// devstage.Stager: the Stager's chunks are DDP's buckets, staged through
// pinned memory with the copies overlapping the transfers.
//
// Built only with the tandemcuda tag; without it the package is empty.
// It has been compiled and linked against CUDA 11.8; it has never run on a
// GPU. Neither the step's agreement with the CPU step (models.NewMLP,
// models.CrossEntropy, optim.SGD) nor data-parallel training's agreement
// with one step on the whole batch nor its speed is known: the tests that
// would say (TestStepMatchesCPU, TestDDPMatchesConcatenatedBatch) have only
// been built. The kernels are compiled at run
// time by NVRTC (libnvrtc, in nvidia-cuda-dev) rather than by nvcc at build
// time, so that a build needs only the headers and libraries that
// scripts/install-cuda.sh installs.
package cudamlp
