package rpc

import (
	"reflect"
	"unsafe"

	"gorgonia.org/tensor"
)

// Received tensors are overwritten whole (from the socket or from the
// sender's memory) before anyone sees them, so zeroing their memory first
// is wasted work: for large tensors it costs about as much as the copy
// itself. The runtime's allocator can skip it; mallocgc is reached by
// linkname, as its documentation allows (go.dev/issue/67401).

//go:linkname mallocgc runtime.mallocgc
func mallocgc(size uintptr, typ unsafe.Pointer, needzero bool) unsafe.Pointer

// uninitFrom is the size from which received tensors skip zeroing.
const uninitFrom = 64 << 10

// newReceiveTensor returns a tensor of dtype dt and shape whose size bytes
// the caller overwrites in full before anyone else sees them.
func newReceiveTensor(dt tensor.Dtype, shape []int, size uint64) *tensor.Dense {
	es := uint64(dt.Size())
	if size < uninitFrom || len(shape) == 0 || es == 0 || size%es != 0 {
		return tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	}
	// The element types that travel hold no pointers: the memory is noscan.
	p := mallocgc(uintptr(size), nil, false)
	backing := reflect.SliceAt(dt.Type, p, int(size/es)).Interface()
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing))
}
