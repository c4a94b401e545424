//go:build linux

package futex

import (
	"runtime"
	"syscall"
)

// Yield is the pause between two looks of a poll on a word that another
// process writes: it runs this process's other goroutines, then gives the
// CPU to any other thread the kernel queued on it (sched_yield(2)), and
// returns at once when there is none. The kernel often runs the writer on
// the poller's own CPU (a wake-up goes to the waker's CPU), and a poll that
// held the CPU would hold up the very write it waits for until its time
// slice ran out, milliseconds later.
func Yield() {
	runtime.Gosched()
	syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
}
