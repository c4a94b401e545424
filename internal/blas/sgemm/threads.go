package sgemm

import (
	"os"
	"runtime"
	"strconv"
)

// Threads of one product.
//
// A tiled product of 2²¹ multiply-adds and more splits its column blocks
// among goroutines. Where several ranks share the host, each running one
// core's worth of work, that only makes them wait on each other's cores:
// make demo's two ranks on two cores ran their backward passes 6% slower
// with the products split in two (2026-11-25, pure Go, 39.4 against 37.1
// ms a step). So, as torchrun sets OMP_NUM_THREADS=1 for its workers, the
// products take their share of the processors: GOMAXPROCS divided by the
// ranks on this host (LOCAL_WORLD_SIZE, which tandem run and torchrun set),
// unless TANDEM_GEMM_THREADS says how many goroutines one product may use.

// ThreadsEnv names the variable that sets how many goroutines one float32
// product may use (a positive integer).
const ThreadsEnv = "TANDEM_GEMM_THREADS"

// productThreads is the most goroutines one product uses, from the
// environment at start-up (see threadsFor).
var productThreads = threadsFor(os.Getenv(ThreadsEnv), os.Getenv("LOCAL_WORLD_SIZE"), runtime.GOMAXPROCS(0))

// threadsFor is the goroutines one product may use: the positive integer
// set, or else procs divided among the local ranks (at least one), or else
// up to 8. Values that are not positive integers are ignored.
func threadsFor(set, localRanks string, procs int) int {
	if n, err := strconv.Atoi(set); err == nil && n > 0 {
		return n
	}
	if n, err := strconv.Atoi(localRanks); err == nil && n > 0 {
		return max(1, procs/n)
	}
	return 8
}

// Threads reports how many goroutines one product may use.
func Threads() int { return productThreads }
