//go:build linux

package futex

import (
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the words live in shared
// file mappings, so waiter and waker may be different processes (or the
// same process through different mappings), which only the shared futex
// key (inode and offset) matches.
const (
	opWait = 0
	opWake = 1
)

// Wait blocks while *w == val, for at most d. It may return early or
// spuriously: every caller re-checks its condition.
func Wait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), opWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Wake wakes every waiter on w. It never blocks, so it skips the
// scheduler's system-call bookkeeping.
func Wake(w *atomic.Uint32) {
	syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), opWake, uintptr(1<<30), 0, 0, 0)
}
