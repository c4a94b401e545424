package devstage

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/errs"
	"gorgonia.org/tensor"
)

// Copy describes one copy that a Host device is about to run, for
// HostCopyHook.
type Copy struct {
	// Seq numbers the device's copies from 0 in the order they were queued.
	Seq int
	// ToDevice is true for a copy from pinned memory into a buffer, false
	// for one from a buffer into pinned memory.
	ToDevice bool
	// Off is the byte offset in the buffer, Bytes the length.
	Off, Bytes int
}

// HostOption configures a Host device.
type HostOption func(*Host)

// HostCopyHook has the Host device call hook on its queue goroutine before
// it runs each copy, with the copy's description; the copy runs when hook
// returns, and the copies queued after it wait. A hook that sleeps
// simulates a slow device link; tests use it to observe and to hold the
// queue.
func HostCopyHook(hook func(Copy)) HostOption { return func(h *Host) { h.hook = hook } }

// Host is a Device whose memory is Go memory and whose copy queue is a
// goroutine of its own that runs the copies in order: the Stager's pipeline
// over it is the CUDA pipeline with memcpy for the DMA engine. Its pinned
// memory is ordinary memory. Close stops the goroutine.
type Host struct {
	hook func(Copy)

	mu     sync.Mutex
	queue  []*hostCopy
	seq    int
	closed bool
	wake   chan struct{}
	done   chan struct{}
}

type hostCopy struct {
	desc     Copy
	dst, src []byte
	fence    *hostFence
}

// NewHost returns a Host device with its queue goroutine running.
func NewHost(opts ...HostOption) *Host {
	h := &Host{wake: make(chan struct{}, 1), done: make(chan struct{})}
	for _, o := range opts {
		o(h)
	}
	go h.run()
	return h
}

func (h *Host) run() {
	defer close(h.done)
	for {
		h.mu.Lock()
		for len(h.queue) == 0 {
			if h.closed {
				h.mu.Unlock()
				return
			}
			h.mu.Unlock()
			<-h.wake
			h.mu.Lock()
		}
		c := h.queue[0]
		h.queue[0] = nil
		h.queue = h.queue[1:]
		h.mu.Unlock()
		if h.hook != nil {
			h.hook(c.desc)
		}
		copy(c.dst, c.src)
		close(c.fence.done)
	}
}

func (h *Host) enqueue(toDevice bool, off int, dst, src []byte) (Fence, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("devstage: host device: queue a copy: %w", comm.ErrClosed)
	}
	c := &hostCopy{desc: Copy{Seq: h.seq, ToDevice: toDevice, Off: off, Bytes: len(src)}, dst: dst, src: src, fence: &hostFence{done: make(chan struct{})}}
	h.seq++
	h.queue = append(h.queue, c)
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return c.fence, nil
}

// Close stops the queue goroutine once the copies already queued have run,
// and waits for it.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
	<-h.done
	return nil
}

// AllocPinned returns n bytes of Go memory.
func (h *Host) AllocPinned(n int) (Pinned, error) {
	if n <= 0 {
		return nil, fmt.Errorf("devstage: host device: allocate %d bytes of pinned memory: %w", n, comm.ErrInvalidArgument)
	}
	return hostPinned(make([]byte, n)), nil
}

// CopyToHost queues a copy of len(dst) bytes of src (a *HostBuffer) from
// byte offset off into dst.
func (h *Host) CopyToHost(dst []byte, src Buffer, off int) (Fence, error) {
	b, err := h.region(src, off, len(dst), "copy to host")
	if err != nil {
		return nil, err
	}
	return h.enqueue(false, off, dst, b)
}

// CopyToDevice queues a copy of src into dst (a *HostBuffer) at byte offset
// off.
func (h *Host) CopyToDevice(dst Buffer, off int, src []byte) (Fence, error) {
	b, err := h.region(dst, off, len(src), "copy to device")
	if err != nil {
		return nil, err
	}
	return h.enqueue(true, off, b, src)
}

func (h *Host) region(buf Buffer, off, n int, what string) ([]byte, error) {
	hb, ok := buf.(*HostBuffer)
	if !ok || hb == nil {
		return nil, fmt.Errorf("devstage: host device: %s: buffer is a %T, not a *HostBuffer: %w", what, buf, comm.ErrInvalidArgument)
	}
	if off < 0 || n < 0 || off+n > len(hb.b) {
		return nil, fmt.Errorf("devstage: host device: %s: bytes [%d, %d) out of the buffer's %d: %w", what, off, off+n, len(hb.b), comm.ErrInvalidArgument)
	}
	return hb.b[off : off+n], nil
}

type hostPinned []byte

func (p hostPinned) Bytes() []byte { return p }
func (p hostPinned) Free() error   { return nil }

type hostFence struct{ done chan struct{} }

func (f *hostFence) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return errs.FromContext(ctx, "devstage: wait for a copy")
	}
}

// HostBuffer is a Host device's buffer: the memory of a dense tensor, shared
// with it (copies into the buffer change the tensor).
type HostBuffer struct {
	t *tensor.Dense
	b []byte
}

// NewHostBuffer returns the buffer over t's memory. t must be contiguous,
// of a dtype the Stager handles (float32, float64, int8, uint8, int32,
// int64).
func NewHostBuffer(t *tensor.Dense) (*HostBuffer, error) {
	if t == nil {
		return nil, fmt.Errorf("devstage: host buffer: nil tensor: %w", comm.ErrInvalidArgument)
	}
	size, ok := elemSize(t.Dtype())
	if !ok {
		return nil, fmt.Errorf("devstage: host buffer: dtype %v is not one of float32, float64, int8, uint8, int32, int64: %w", t.Dtype(), comm.ErrInvalidArgument)
	}
	if t.RequiresIterator() {
		return nil, fmt.Errorf("devstage: host buffer: tensor is a non-contiguous view; pass a contiguous tensor (Materialize it): %w", comm.ErrInvalidArgument)
	}
	n := t.DataSize()
	if len(t.Raw) < n*size {
		return nil, fmt.Errorf("devstage: host buffer: tensor holds %d bytes, its %d elements need %d: %w", len(t.Raw), n, n*size, comm.ErrInvalidArgument)
	}
	return &HostBuffer{t: t, b: t.Raw[:n*size]}, nil
}

// Tensor is the tensor whose memory the buffer is.
func (b *HostBuffer) Tensor() *tensor.Dense { return b.t }

// Dtype is the tensor's dtype.
func (b *HostBuffer) Dtype() tensor.Dtype { return b.t.Dtype() }

// Len is the tensor's number of elements.
func (b *HostBuffer) Len() int { return b.t.DataSize() }
