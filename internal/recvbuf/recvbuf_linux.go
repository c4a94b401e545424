//go:build linux

package recvbuf

import (
	"syscall"
	"unsafe"
)

// hugePageHint asks the kernel to back the 2 MiB-aligned pages inside
// [p, p+size) with transparent huge pages when they are first touched: a
// fresh 4 MiB receive buffer then costs two page faults instead of a
// thousand. It is a hint; failures are ignored.
func hugePageHint(p unsafe.Pointer, size uintptr) {
	if size < hugePage {
		return
	}
	start := (uintptr(p) + hugePage - 1) &^ (hugePage - 1)
	end := (uintptr(p) + size) &^ (hugePage - 1)
	if end <= start {
		return
	}
	syscall.Syscall(syscall.SYS_MADVISE, start, end-start, 14 /* MADV_HUGEPAGE */)
}

// populate maps the pages of [p, p+size) at once (MADV_POPULATE_WRITE,
// Linux 5.14), as the first writes to them would one fault at a time. It
// is a hint; failures are ignored.
func populate(p unsafe.Pointer, size uintptr) {
	syscall.Syscall(syscall.SYS_MADVISE, uintptr(p), size, 23 /* MADV_POPULATE_WRITE */)
}
