//go:build linux

package shm

import (
	"bytes"
	"os"
	"strconv"
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

// processGone reports whether the process with the given id has ended:
// no process has the id, or it is a zombie that its parent has not reaped
// yet (a rank killed under a launcher or test harness stays one until its
// parent waits for it, and kill(pid, 0) still finds it).
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// "pid (comm) S ...": the state follows the last ')', since comm may
	// hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	state := b[i+2]
	return state == 'Z' || state == 'X'
}
