//go:build tandemcuda

package devstage

// #cgo LDFLAGS: -lcuda
// #include <cuda.h>
//
// // Page-locked host memory; gorgonia.org/cu frees it (MemFreeHost) but has
// // no call that allocates it.
// static CUresult tandemAllocHost(void **p, size_t n) { return cuMemAllocHost(p, n); }
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/errs"
	"gorgonia.org/cu"
	"gorgonia.org/tensor"
)

// CUDA is a Device on one CUDA GPU, through gorgonia.org/cu: the device's
// primary context (the one the CUDA runtime and cuBLAS use, so buffers
// from either are valid here), one non-blocking stream that runs the
// staging copies in order, pinned memory from cuMemAllocHost, and a CUDA
// event recorded after each copy as its Fence.
//
// Built only with the tandemcuda tag. It has been compiled and linked
// against CUDA 11.8 (Debian's nvidia-cuda-dev), never run on a GPU: see
// the package doc.
type CUDA struct {
	dev    cu.Device
	ctx    cu.CUContext
	stream cu.Stream

	mu     sync.Mutex
	closed bool
}

// NewCUDA returns the Device for GPU ordinal (0 for the first).
func NewCUDA(ordinal int) (*CUDA, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: count devices: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("devstage: cuda: device %d of %d: %w", ordinal, n, comm.ErrInvalidArgument)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: device %d: %w", ordinal, err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: retain device %d's primary context: %w", ordinal, err)
	}
	c := &CUDA{dev: dev, ctx: ctx}
	if err := c.do(func() error {
		s, err := cu.MakeStream(cu.NonBlocking)
		c.stream = s
		return err
	}); err != nil {
		_ = dev.ReleasePrimaryCtx()
		return nil, fmt.Errorf("devstage: cuda: create a stream on device %d: %w", ordinal, err)
	}
	return c, nil
}

// do runs fn on this goroutine's OS thread with the device's context
// current: driver calls act on the calling thread's current context, and a
// goroutine may change threads between two statements.
func (c *CUDA) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(c.ctx); err != nil {
		return fmt.Errorf("set the current context: %w", err)
	}
	return fn()
}

// Do runs fn on the calling goroutine's OS thread with the device's
// context current, for driver and library calls (cuBLAS) made outside this
// package.
func (c *CUDA) Do(fn func() error) error { return c.do(fn) }

// Stream is the stream that runs the staging copies. Work on the same
// device buffers belongs on it too (cublasSetStream), so that a copy
// queued after a kernel reads the kernel's result: the stream is
// non-blocking, and does not wait for work on the default stream.
func (c *CUDA) Stream() cu.Stream { return c.stream }

// Close waits for the stream's copies, destroys the stream and releases
// the primary context. Close the Stagers and free the buffers that use the
// device first: their memory is freed through it.
func (c *CUDA) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	err := c.do(func() error {
		return errors.Join(c.stream.Synchronize(), c.stream.Destroy())
	})
	return errors.Join(err, c.dev.ReleasePrimaryCtx())
}

// AllocPinned returns n bytes of page-locked host memory.
func (c *CUDA) AllocPinned(n int) (Pinned, error) {
	if n <= 0 {
		return nil, fmt.Errorf("devstage: cuda: allocate %d bytes of pinned memory: %w", n, comm.ErrInvalidArgument)
	}
	var p unsafe.Pointer
	err := c.do(func() error {
		if r := C.tandemAllocHost(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuMemAllocHost: CUresult %d", int(r))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: allocate %d bytes of pinned memory: %w", n, err)
	}
	return &cudaPinned{c: c, p: p, b: unsafe.Slice((*byte)(p), n)}, nil
}

type cudaPinned struct {
	c *CUDA
	p unsafe.Pointer
	b []byte
}

func (p *cudaPinned) Bytes() []byte { return p.b }

func (p *cudaPinned) Free() error {
	if p.p == nil {
		return nil
	}
	err := p.c.do(func() error { return cu.MemFreeHost(p.p) })
	p.p, p.b = nil, nil
	if err != nil {
		return fmt.Errorf("devstage: cuda: free pinned memory: %w", err)
	}
	return nil
}

// CUDABuffer is device memory holding Len elements of Dtype.
type CUDABuffer struct {
	// Ptr is the first byte.
	Ptr   cu.DevicePtr
	dtype tensor.Dtype
	n     int
	owned bool
}

// NewCUDABuffer describes n elements of dt at ptr, memory allocated
// elsewhere (by cuBLAS's caller, gorgonia's CUDA engine, cu.MemAlloc).
func NewCUDABuffer(ptr cu.DevicePtr, dt tensor.Dtype, n int) (*CUDABuffer, error) {
	if _, ok := elemSize(dt); !ok {
		return nil, fmt.Errorf("devstage: cuda buffer: dtype %v is not one of float32, float64, int8, uint8, int32, int64: %w", dt, comm.ErrInvalidArgument)
	}
	if n < 0 || (n > 0 && ptr == 0) {
		return nil, fmt.Errorf("devstage: cuda buffer: %d elements at %v: %w", n, ptr, comm.ErrInvalidArgument)
	}
	return &CUDABuffer{Ptr: ptr, dtype: dt, n: n}, nil
}

// AllocBuffer allocates device memory for n elements of dt; Free returns
// it.
func (c *CUDA) AllocBuffer(dt tensor.Dtype, n int) (*CUDABuffer, error) {
	size, ok := elemSize(dt)
	if !ok || n <= 0 {
		return nil, fmt.Errorf("devstage: cuda: allocate %d elements of %v: %w", n, dt, comm.ErrInvalidArgument)
	}
	var p cu.DevicePtr
	err := c.do(func() (err error) { p, err = cu.MemAlloc(int64(n * size)); return err })
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: allocate %d bytes of device memory: %w", n*size, err)
	}
	return &CUDABuffer{Ptr: p, dtype: dt, n: n, owned: true}, nil
}

// Free returns memory from AllocBuffer to the device; a buffer from
// NewCUDABuffer is left alone.
func (c *CUDA) Free(b *CUDABuffer) error {
	if b == nil || !b.owned || b.Ptr == 0 {
		return nil
	}
	err := c.do(func() error { return cu.MemFree(b.Ptr) })
	b.Ptr = 0
	return err
}

// Write waits for the work queued on the device's stream, then copies src
// into b from byte offset off and waits for the copy (a synchronous
// cuMemcpyHtoD).
func (c *CUDA) Write(b *CUDABuffer, off int, src []byte) error {
	p, err := c.region(b, off, len(src), "write")
	if err != nil {
		return err
	}
	if err := c.do(func() error {
		if err := c.stream.Synchronize(); err != nil {
			return err
		}
		return cu.MemcpyHtoD(p, unsafe.Pointer(&src[0]), int64(len(src)))
	}); err != nil {
		return fmt.Errorf("devstage: cuda: write %d bytes: %w", len(src), err)
	}
	return nil
}

// Read waits for the work queued on the device's stream, then copies
// len(dst) bytes of b from byte offset off into dst and waits for the copy
// (a synchronous cuMemcpyDtoH).
func (c *CUDA) Read(dst []byte, b *CUDABuffer, off int) error {
	p, err := c.region(b, off, len(dst), "read")
	if err != nil {
		return err
	}
	if err := c.do(func() error {
		if err := c.stream.Synchronize(); err != nil {
			return err
		}
		return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), p, int64(len(dst)))
	}); err != nil {
		return fmt.Errorf("devstage: cuda: read %d bytes: %w", len(dst), err)
	}
	return nil
}

// Dtype is the element type.
func (b *CUDABuffer) Dtype() tensor.Dtype { return b.dtype }

// Len is the number of elements.
func (b *CUDABuffer) Len() int { return b.n }

func (c *CUDA) region(buf Buffer, off, n int, what string) (cu.DevicePtr, error) {
	b, ok := buf.(*CUDABuffer)
	if !ok || b == nil {
		return 0, fmt.Errorf("devstage: cuda: %s: buffer is a %T, not a *CUDABuffer: %w", what, buf, comm.ErrInvalidArgument)
	}
	size, _ := elemSize(b.dtype)
	if off < 0 || n <= 0 || off+n > b.n*size {
		return 0, fmt.Errorf("devstage: cuda: %s: bytes [%d, %d) out of the buffer's %d: %w", what, off, off+n, b.n*size, comm.ErrInvalidArgument)
	}
	return b.Ptr + cu.DevicePtr(off), nil
}

// CopyToHost queues cuMemcpyDtoHAsync on the stream.
func (c *CUDA) CopyToHost(dst []byte, src Buffer, off int) (Fence, error) {
	p, err := c.region(src, off, len(dst), "copy to host")
	if err != nil {
		return nil, err
	}
	return c.queue("copy to host", func() error {
		return cu.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), p, int64(len(dst)), c.stream)
	})
}

// CopyToDevice queues cuMemcpyHtoDAsync on the stream.
func (c *CUDA) CopyToDevice(dst Buffer, off int, src []byte) (Fence, error) {
	p, err := c.region(dst, off, len(src), "copy to device")
	if err != nil {
		return nil, err
	}
	return c.queue("copy to device", func() error {
		return cu.MemcpyHtoDAsync(p, unsafe.Pointer(&src[0]), int64(len(src)), c.stream)
	})
}

// queue runs enqueue (an async copy on the stream) and records an event after
// it.
func (c *CUDA) queue(what string, enqueue func() error) (Fence, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("devstage: cuda: %s: device closed: %w", what, comm.ErrClosed)
	}
	f := &cudaFence{c: c}
	err := c.do(func() error {
		if err := enqueue(); err != nil {
			return err
		}
		ev, err := cu.MakeEvent(cu.DisableTiming)
		if err != nil {
			return err
		}
		if err := ev.Record(c.stream); err != nil {
			_ = cu.DestroyEvent(&ev)
			return err
		}
		f.ev = ev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("devstage: cuda: %s: %w", what, err)
	}
	return f, nil
}

// cudaFence waits for its event by polling cuEventQuery, so that the wait
// honours the context (cuEventSynchronize cannot be interrupted).
type cudaFence struct {
	c    *CUDA
	mu   sync.Mutex
	ev   cu.Event
	done bool
}

func (f *cudaFence) Wait(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	pause := 10 * time.Microsecond
	for !f.done {
		err := f.c.do(func() error { return f.ev.Query() })
		switch {
		case err == nil:
			f.done = true
			_ = f.c.do(func() error { return cu.DestroyEvent(&f.ev) })
		case errors.Is(err, cu.NotReady):
			select {
			case <-time.After(pause):
				pause = min(2*pause, time.Millisecond)
			case <-ctx.Done():
				return errs.FromContext(ctx, "devstage: cuda: wait for a copy")
			}
		default:
			return fmt.Errorf("devstage: cuda: wait for a copy: %w", err)
		}
	}
	return nil
}
