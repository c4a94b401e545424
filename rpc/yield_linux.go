package rpc

import "syscall"

// yieldThread gives this thread's CPU to any other runnable thread that the
// kernel put on it (sched_yield(2)), and returns at once when there is none.
// A wait that polls memory a peer process writes calls it between looks:
// the kernel often runs the peer on the waiter's CPU (a wake-up over a
// loopback socket goes to the waker's CPU), and a poll that held the CPU
// would hold up the very write it waits for until its time slice ran out,
// milliseconds later.
func yieldThread() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
