//go:build !linux

package futex

import "runtime"

// Yield is the pause between two looks of a poll on a word that another
// process writes. Without sched_yield(2) it runs this process's other
// goroutines only, and a writer queued on the same CPU runs when the
// kernel preempts the poller.
func Yield() { runtime.Gosched() }
