package devstage

import (
	"context"

	"gorgonia.org/tensor"
)

// Buffer is a flat array of Len elements of Dtype in a device's memory. Its
// concrete type belongs to the Device that made it: a Device refuses
// buffers of another's.
type Buffer interface {
	// Dtype is the element type.
	Dtype() tensor.Dtype
	// Len is the number of elements.
	Len() int
}

// Pinned is host memory from Device.AllocPinned: memory the device can copy
// to and from while the host goes on (page-locked memory for CUDA).
type Pinned interface {
	// Bytes is the memory. Slices of it are what CopyToHost and CopyToDevice
	// take.
	Bytes() []byte
	// Free releases the memory. No copy into or out of it may be pending.
	Free() error
}

// Fence completes when the copy that returned it has finished.
type Fence interface {
	// Wait blocks until the copy has finished or ctx is done. A copy whose
	// Wait returned early for ctx is still pending.
	Wait(ctx context.Context) error
}

// Device is what the Stager needs from a device: pinned host memory and
// asynchronous copies between it and device memory. A Device runs the copies
// it is given in the order it was given them, one after another, each
// starting after the previous one has finished (a CUDA stream): that order is
// what lets the Stager reuse a pinned buffer as soon as the copy reading it
// has been queued, without waiting for it.
//
// Two implementations exist: Host (no build tag), a device whose memory is
// ordinary Go memory and whose queue is a goroutine, used by the tests and
// by CPU-only programs; and CUDA (build tag cuda), over gorgonia.org/cu.
type Device interface {
	// AllocPinned returns n bytes of pinned host memory.
	AllocPinned(n int) (Pinned, error)
	// CopyToHost queues a copy of len(dst) bytes of src, from byte offset
	// off, into dst, which lies in memory from AllocPinned. It returns at
	// once.
	CopyToHost(dst []byte, src Buffer, off int) (Fence, error)
	// CopyToDevice queues a copy of src, which lies in memory from
	// AllocPinned, into dst at byte offset off. It returns at once.
	CopyToDevice(dst Buffer, off int, src []byte) (Fence, error)
}
