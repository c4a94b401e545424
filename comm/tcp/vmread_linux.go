//go:build linux

package tcp

import (
	"io"
	"syscall"
	"unsafe"
)

// remoteIovec is a struct iovec that names memory of another process: a
// plain address, which Go must not take for a pointer.
type remoteIovec struct {
	base uintptr
	len  uintptr
}

// vmReadPiece bounds one process_vm_readv call. The calls are made as raw
// system calls, which keep their P (no hand-off to another thread, no
// wake-ups: a copy is short work, not a wait), so each is kept short enough
// (a fraction of a millisecond) not to hold up the scheduler or a garbage
// collection.
const vmReadPiece = 1 << 20

// processVMRead copies len(local) bytes from address remote of process pid
// into local with process_vm_readv(2): one copy, from the other process's
// memory straight into ours.
func processVMRead(pid int, local []byte, remote uint64) error {
	for len(local) > 0 {
		piece := min(len(local), vmReadPiece)
		liov := syscall.Iovec{Base: &local[0]}
		liov.SetLen(piece)
		riov := remoteIovec{base: uintptr(remote), len: uintptr(piece)}
		n, _, errno := syscall.RawSyscall6(sysProcessVMReadv, uintptr(pid),
			uintptr(unsafe.Pointer(&liov)), 1, uintptr(unsafe.Pointer(&riov)), 1, 0)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return errno
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		local = local[n:]
		remote += uint64(n)
	}
	return nil
}
