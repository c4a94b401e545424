//go:build tandemcuda

package cudamlp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/internal/cudablas"
	"gorgonia.org/cu"
	"gorgonia.org/cu/nvrtc"
	"gorgonia.org/tensor"
)

// threads is the block size of the element-wise kernels.
const threads = 256

// Step is an MLP's training step on one GPU for a fixed batch size: the
// parameters, their gradients and every activation live in device memory.
type Step struct {
	dev   *devstage.CUDA
	bl    *cudablas.BLAS
	mod   cu.Module
	relu  cu.Function
	reluB cu.Function
	xent  cu.Function

	sizes []int
	batch int
	w, b  []*devstage.CUDABuffer // layer l's weight [out, in] and bias [out]
	dw    []*devstage.CUDABuffer // views of grad
	db    []*devstage.CUDABuffer
	grad  *devstage.CUDABuffer   // every gradient, layer by layer, weight then bias
	acts  []*devstage.CUDABuffer // acts[0] the input, acts[l+1] layer l's output
	dacts []*devstage.CUDABuffer // dacts[l] the loss's gradient by acts[l], l ≥ 1
	ones  *devstage.CUDABuffer   // batch ones, for the bias passes
	label *devstage.CUDABuffer   // int32 labels
	loss  *devstage.CUDABuffer   // the loss's share of each row
	owned []*devstage.CUDABuffer
}

// New puts an MLP of the given layer sizes on dev for batches of batch
// rows, with params as its initial parameters: for each layer its float32
// weight [out, in] then its bias [out], the order of
// models.NewMLP(...).Params() with bias.
func New(dev *devstage.CUDA, sizes []int, batch int, params []*tensor.Dense) (s *Step, err error) {
	if dev == nil || len(sizes) < 2 || batch < 1 {
		return nil, fmt.Errorf("cudamlp: new: want a device, at least 2 sizes and a positive batch (got %v, batch %d): %w", sizes, batch, comm.ErrInvalidArgument)
	}
	layers := len(sizes) - 1
	if len(params) != 2*layers {
		return nil, fmt.Errorf("cudamlp: new: %d parameters for %d layers, want a weight and a bias each: %w", len(params), layers, comm.ErrInvalidArgument)
	}
	s = &Step{dev: dev, sizes: append([]int(nil), sizes...), batch: batch}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.bl, err = cudablas.New(dev); err != nil {
		return nil, err
	}
	if err := s.compile(); err != nil {
		return nil, err
	}
	alloc := func(dt tensor.Dtype, n int) (*devstage.CUDABuffer, error) {
		b, err := dev.AllocBuffer(dt, n)
		if err == nil {
			s.owned = append(s.owned, b)
		}
		return b, err
	}
	total := 0
	for l := 0; l < layers; l++ {
		total += sizes[l+1]*sizes[l] + sizes[l+1]
	}
	if s.grad, err = alloc(tensor.Float32, total); err != nil {
		return nil, err
	}
	view := func(off, n int) (*devstage.CUDABuffer, error) {
		return devstage.NewCUDABuffer(s.grad.Ptr+cu.DevicePtr(4*off), tensor.Float32, n)
	}
	off := 0
	for l := 0; l < layers; l++ {
		in, out := sizes[l], sizes[l+1]
		w, bias := params[2*l], params[2*l+1]
		if err := checkParam(w, out, in); err != nil {
			return nil, fmt.Errorf("cudamlp: new: layer %d's weight: %w", l, err)
		}
		if err := checkParam(bias, out); err != nil {
			return nil, fmt.Errorf("cudamlp: new: layer %d's bias: %w", l, err)
		}
		bufs := make([]*devstage.CUDABuffer, 4)
		for i, n := range []int{out * in, out} {
			if bufs[i], err = alloc(tensor.Float32, n); err != nil {
				return nil, err
			}
			if bufs[2+i], err = view(off, n); err != nil {
				return nil, err
			}
			off += n
		}
		s.w, s.b, s.dw, s.db = append(s.w, bufs[0]), append(s.b, bufs[1]), append(s.dw, bufs[2]), append(s.db, bufs[3])
		if err := dev.Write(bufs[0], 0, bytesOf(w.Data().([]float32))); err != nil {
			return nil, err
		}
		if err := dev.Write(bufs[1], 0, bytesOf(bias.Data().([]float32))); err != nil {
			return nil, err
		}
	}
	s.acts = make([]*devstage.CUDABuffer, layers+1)
	s.dacts = make([]*devstage.CUDABuffer, layers+1)
	for l, n := range sizes {
		if s.acts[l], err = alloc(tensor.Float32, batch*n); err != nil {
			return nil, err
		}
		if l > 0 {
			if s.dacts[l], err = alloc(tensor.Float32, batch*n); err != nil {
				return nil, err
			}
		}
	}
	if s.ones, err = alloc(tensor.Float32, batch); err != nil {
		return nil, err
	}
	ones := make([]float32, batch)
	for i := range ones {
		ones[i] = 1
	}
	if err := dev.Write(s.ones, 0, bytesOf(ones)); err != nil {
		return nil, err
	}
	if s.label, err = alloc(tensor.Int32, batch); err != nil {
		return nil, err
	}
	if s.loss, err = alloc(tensor.Float32, batch); err != nil {
		return nil, err
	}
	return s, nil
}

func checkParam(t *tensor.Dense, shape ...int) error {
	if t == nil || t.Dtype() != tensor.Float32 {
		return fmt.Errorf("want a float32 tensor: %w", comm.ErrInvalidArgument)
	}
	if !t.Shape().Eq(tensor.Shape(shape)) || t.RequiresIterator() {
		return fmt.Errorf("shape %v, want a contiguous %v: %w", t.Shape(), shape, comm.ErrInvalidArgument)
	}
	return nil
}

func bytesOf[T float32 | int32](s []T) []byte {
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// compile turns kernelSource into PTX with NVRTC and loads it.
func (s *Step) compile() error {
	prog, err := nvrtc.CreateProgram(kernelSource, "tandem_mlp.cu")
	if err != nil {
		return fmt.Errorf("cudamlp: nvrtc: create the program: %w", err)
	}
	defer prog.Destroy()
	if err := prog.Compile(); err != nil {
		log, _ := prog.GetLog()
		return fmt.Errorf("cudamlp: nvrtc: compile the kernels: %w\n%s", err, log)
	}
	ptx, err := prog.GetPTX()
	if err != nil {
		return fmt.Errorf("cudamlp: nvrtc: get the PTX: %w", err)
	}
	return s.dev.Do(func() error {
		if s.mod, err = cu.LoadData(ptx); err != nil {
			return fmt.Errorf("cudamlp: load the kernels' PTX: %w", err)
		}
		for _, k := range []struct {
			fn   *cu.Function
			name string
		}{{&s.relu, "relu_forward"}, {&s.reluB, "relu_backward"}, {&s.xent, "softmax_xent"}} {
			if *k.fn, err = s.mod.Function(k.name); err != nil {
				return fmt.Errorf("cudamlp: kernel %s: %w", k.name, err)
			}
		}
		return nil
	})
}

// launch queues fn over n threads on the device's stream; args point to
// 8-byte values (device pointers, int64s), as cu.Function.Launch reads
// them.
func (s *Step) launch(fn cu.Function, n int, args ...unsafe.Pointer) error {
	blocks := (n + threads - 1) / threads
	return s.dev.Do(func() error { return fn.Launch(blocks, 1, 1, threads, 1, 1, 0, s.dev.Stream(), args) })
}

// Grads computes the loss of the batch (x: batch×sizes[0], row-major;
// y: the batch's labels) and leaves its gradients by the parameters in the
// buffers of GradBuffers. It returns the mean cross-entropy.
func (s *Step) Grads(x []float32, y []int64) (float64, error) {
	layers := len(s.sizes) - 1
	classes := s.sizes[layers]
	if len(x) != s.batch*s.sizes[0] || len(y) != s.batch {
		return 0, fmt.Errorf("cudamlp: step: %d inputs and %d labels, want %d and %d: %w", len(x), len(y), s.batch*s.sizes[0], s.batch, comm.ErrInvalidArgument)
	}
	labels := make([]int32, s.batch)
	for i, v := range y {
		if v < 0 || v >= int64(classes) {
			return 0, fmt.Errorf("cudamlp: step: label %d of row %d is not a class of %d: %w", v, i, classes, comm.ErrInvalidArgument)
		}
		labels[i] = int32(v)
	}
	if err := s.dev.Write(s.acts[0], 0, bytesOf(x)); err != nil {
		return 0, err
	}
	if err := s.dev.Write(s.label, 0, bytesOf(labels)); err != nil {
		return 0, err
	}
	bt := s.batch
	// Forward: acts[l+1] = acts[l]·Wᵀ + 1·bᵀ, then ReLU but after the last.
	for l := 0; l < layers; l++ {
		in, out := s.sizes[l], s.sizes[l+1]
		if err := s.bl.Sgemm(false, true, bt, out, in, 1, s.acts[l], in, s.w[l], in, 0, s.acts[l+1], out); err != nil {
			return 0, err
		}
		if err := s.bl.Sgemm(false, false, bt, out, 1, 1, s.ones, 1, s.b[l], out, 1, s.acts[l+1], out); err != nil {
			return 0, err
		}
		if l < layers-1 {
			n := int64(bt * out)
			if err := s.launch(s.relu, int(n), unsafe.Pointer(&s.acts[l+1].Ptr), unsafe.Pointer(&n)); err != nil {
				return 0, fmt.Errorf("cudamlp: relu of layer %d: %w", l, err)
			}
		}
	}
	nb, nc := int64(bt), int64(classes)
	if err := s.launch(s.xent, bt, unsafe.Pointer(&s.acts[layers].Ptr), unsafe.Pointer(&s.label.Ptr),
		unsafe.Pointer(&s.dacts[layers].Ptr), unsafe.Pointer(&s.loss.Ptr), unsafe.Pointer(&nb), unsafe.Pointer(&nc)); err != nil {
		return 0, fmt.Errorf("cudamlp: softmax cross-entropy: %w", err)
	}
	// Backward: dW = Gᵀ·acts[l], db = 1ᵀ·G, G' = G·W masked by the ReLU.
	for l := layers - 1; l >= 0; l-- {
		in, out := s.sizes[l], s.sizes[l+1]
		g := s.dacts[l+1]
		if err := s.bl.Sgemm(true, false, out, in, bt, 1, g, out, s.acts[l], in, 0, s.dw[l], in); err != nil {
			return 0, err
		}
		if err := s.bl.Sgemm(true, false, 1, out, bt, 1, s.ones, 1, g, out, 0, s.db[l], out); err != nil {
			return 0, err
		}
		if l > 0 {
			if err := s.bl.Sgemm(false, false, bt, in, out, 1, g, out, s.w[l], in, 0, s.dacts[l], in); err != nil {
				return 0, err
			}
			n := int64(bt * in)
			if err := s.launch(s.reluB, int(n), unsafe.Pointer(&s.dacts[l].Ptr), unsafe.Pointer(&s.acts[l].Ptr), unsafe.Pointer(&n)); err != nil {
				return 0, fmt.Errorf("cudamlp: relu gradient of layer %d: %w", l-1, err)
			}
		}
	}
	rows := make([]float32, bt)
	if err := s.dev.Read(bytesOf(rows), s.loss, 0); err != nil {
		return 0, err
	}
	var loss float64
	for _, v := range rows {
		loss += float64(v)
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, fmt.Errorf("cudamlp: step: the loss is %v", loss)
	}
	return loss, nil
}

// GradBuffer is every gradient in one device buffer, in the parameters'
// order (layer by layer, weight then bias): DDP's buckets on the device,
// each of a Stager's chunks one bucket's all-reduce.
func (s *Step) GradBuffer() *devstage.CUDABuffer { return s.grad }

// AllReduceGrads averages the gradients across pg's ranks through st, a
// Stager over this Step's device: the copies to the host are queued on the
// device's stream after the backward pass, so they read its results. Every
// rank calls it after Grads and before SGD, as DDP's all-reduce sits
// between backward and the optimizer.
func (s *Step) AllReduceGrads(ctx context.Context, st *devstage.Stager, pg *comm.ProcessGroup) error {
	if err := st.AllReduce(ctx, pg, s.grad, comm.Avg); err != nil {
		return fmt.Errorf("cudamlp: all-reduce the gradients: %w", err)
	}
	return nil
}

// SGD queues p -= lr·grad for every parameter.
func (s *Step) SGD(lr float32) error {
	for l := range s.w {
		if err := s.bl.Saxpy(-lr, s.dw[l], s.w[l]); err != nil {
			return err
		}
		if err := s.bl.Saxpy(-lr, s.db[l], s.b[l]); err != nil {
			return err
		}
	}
	return nil
}

// Params copies the parameters back into new tensors, in New's order.
func (s *Step) Params() ([]*tensor.Dense, error) {
	var out []*tensor.Dense
	for l := range s.w {
		in, o := s.sizes[l], s.sizes[l+1]
		w, b := make([]float32, o*in), make([]float32, o)
		if err := s.dev.Read(bytesOf(w), s.w[l], 0); err != nil {
			return nil, err
		}
		if err := s.dev.Read(bytesOf(b), s.b[l], 0); err != nil {
			return nil, err
		}
		out = append(out, tensor.New(tensor.WithShape(o, in), tensor.WithBacking(w)), tensor.New(tensor.WithShape(o), tensor.WithBacking(b)))
	}
	return out, nil
}

// Close frees the device memory, the kernels and the cuBLAS handle.
func (s *Step) Close() error {
	var errs []error
	for _, b := range s.owned {
		errs = append(errs, s.dev.Free(b))
	}
	s.owned = nil
	if s.mod != (cu.Module{}) {
		errs = append(errs, s.dev.Do(s.mod.Unload))
		s.mod = cu.Module{}
	}
	if s.bl != nil {
		errs = append(errs, s.bl.Close())
		s.bl = nil
	}
	return errors.Join(errs...)
}
