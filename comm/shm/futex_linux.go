//go:build linux

package shm

import (
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Futex operations without FUTEX_PRIVATE_FLAG: the words live in a shared
// file mapping, so waiter and waker may be different processes (or the same
// process through different mappings), which only the shared futex key
// (inode and offset) matches.
const (
	futexWait = 0
	futexWake = 1
)

// wait blocks while *w == val, for at most d. Spurious and early returns are
// fine: every caller re-checks its condition.
func wait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// wake wakes every waiter on w. It never blocks, so it skips the
// scheduler's system-call bookkeeping.
func wake(w *atomic.Uint32) {
	syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, uintptr(1<<30), 0, 0, 0)
}

// processGone reports whether no process has the given id.
func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}
