// Package devstage runs Tandem's collectives on device (GPU) memory by
// staging it through pinned host memory, the way gloo does for CUDA
// tensors: the process groups and their transports keep moving host bytes
// point to point, and this package is the one place where device memory
// meets them.
//
// # The pipeline
//
// A Stager splits a device Buffer into chunks (WithChunkBytes, 4 MiB by
// default) and alternates them between two pinned host buffers. For each
// chunk k it waits for the chunk's copy to the host, runs the collective
// (pg.AllReduce, pg.Broadcast) on the pinned memory, and queues the copy of
// the result back to the device; before starting chunk k's collective it has
// already queued chunk k+1's copy to the host, so the device copies chunk
// k+1 while the group moves chunk k, and copies chunk k's result back while
// the group moves chunk k+1. The Device runs its copies in order (a CUDA
// stream), which is what lets a pinned buffer be refilled as soon as the
// copy reading it has been queued. Every rank of a group passes a buffer of
// the same dtype and length and uses the same chunk size; each chunk is one
// collective of the group, checked across ranks like any other (a
// difference fails with comm.ErrMismatch). WithTrace reports each step.
//
// A failed or canceled call returns at once; the copies it had queued still
// use the pinned buffers, and the next call (or Close) waits for them first.
//
// # Devices
//
// Device is the small interface the pipeline is written against: pinned
// allocation, an asynchronous copy each way, and a Fence per copy. Host (no
// build tag) is a Device whose memory is Go memory and whose queue is a
// goroutine: the tests run the pipeline over it, on real process groups
// (goroutine ranks over comm/local, and two ranks over comm/tcp's sockets),
// and check the results, the order of every step, and that each copy really
// is in flight while the collective it should overlap starts. CUDA (build
// tag tandemcuda) is the Device over gorgonia.org/cu: the GPU's primary
// context, one non-blocking stream, cuMemAllocHost for the pinned memory,
// cuMemcpyDtoHAsync and cuMemcpyHtoDAsync, and a CUDA event per copy that
// the Fence polls, so that waits honour their context.
//
// # What has run, and what has not
//
// The pipeline, the Stager and the Host device are tested on the CPU
// (go test ./comm/devstage). The CUDA device is compiled, vetted and linked
// against CUDA 11.8 (Debian's nvidia-cuda-dev, libcuda 535) by make
// check-cuda, together with a test (TestCUDAAllReduce, tag tandemcuda) that
// stages an all-reduce of GPU buffers across three ranks and checks the
// sums; neither has ever run on a GPU, so the CUDA path is unverified: its
// correctness on a device, and whether its copies overlap the transfers
// there, are not known. A binary built with the tag cannot start on a
// machine without a GPU and driver: gorgonia.org/cu initialises the driver
// when the program starts and exits if that fails.
//
// The tag is tandemcuda, not cuda: gorgonia's own `cuda` tag switches its
// graph engine to CUDA, which needs cuDNN (not in Debian), and that engine is
// not what Tandem's GPU path uses. scripts/install-cuda.sh installs what the
// tag needs on Debian bookworm.
package devstage
