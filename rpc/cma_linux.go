//go:build linux

package rpc

import (
	"errors"
	"runtime"
	"syscall"
	"unsafe"
)

// sysProcessVMReadv is process_vm_readv's number on this architecture (0:
// unknown, same-host copies off).
var sysProcessVMReadv = map[string]uintptr{
	"amd64": 310, "386": 347, "arm64": 270, "arm": 376, "riscv64": 270,
	"loong64": 270, "ppc64": 351, "ppc64le": 351, "s390x": 340,
}[runtime.GOARCH]

var cmaSupported = sysProcessVMReadv != 0

// remoteIovec is a struct iovec naming memory of another process: an address
// there, not a pointer here.
type remoteIovec struct {
	base uintptr
	len  uintptr
}

// cmaRead copies len(dst) bytes at addr in process pid into dst.
func cmaRead(pid int, dst []byte, addr uint64) error {
	for len(dst) > 0 {
		local := syscall.Iovec{Base: &dst[0]}
		local.SetLen(len(dst))
		remote := remoteIovec{base: uintptr(addr), len: uintptr(len(dst))}
		n, _, errno := syscall.Syscall6(sysProcessVMReadv, uintptr(pid),
			uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		if n == 0 {
			return errors.New("process_vm_readv copied nothing")
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}
