//go:build !linux

package rpc

import "runtime"

// yieldThread yields to this process's other goroutines only: where
// sched_yield(2) is not at hand, the poll that calls it relies on the
// kernel's preemption to let a peer process on the same CPU run.
func yieldThread() { runtime.Gosched() }
