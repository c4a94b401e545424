package comm

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/tandemml/tandem/internal/bytesize"
)

// The staging buffers' size (stageBlock in stage.go's notes). A block's
// shares should stay in the level-2 cache while their owner reduces them,
// so a block is one core's level-2 cache. Measured with tandem bench
// allreduce, one process a rank, 16 and 64 MiB:
//
//   - on a 2-core machine with 2 MiB of level-2 cache a core (2026-11-25,
//     world 4, 64 MiB): 51-55 ms in blocks of 2 MiB, 54-56 in 1 MiB, 58-61
//     in 4 MiB, 61-66 in 512 KiB;
//   - on a 2-core AMD EPYC machine with 512 KiB a core (2026-12-01, three
//     runs each): world 2 at 3.4-4.8 GB/s bus bandwidth in blocks of 256
//     and 512 KiB against 1.9-2.5 in 2 MiB; world 4 at 1.5-1.96 GB/s
//     against 0.9-1.1, and 1.1-1.7 in 128 KiB.
//
// A staging buffer holds at least stageRoom bytes, so that a reduction of
// up to that size still goes through in one round.
//
// Ranks that outnumber the CPUs stage in blocks of crowdedStageBlock
// instead (stageBlockFor).
const (
	stageRoom         = 2 << 20
	defaultStageBlock = 2 << 20 // where the cache's size is unknown
	minStageBlock     = 256 << 10
	maxCacheBlock     = 4 << 20 // the largest block a cache's size chooses
	crowdedStageBlock = 32 << 20
	maxStageBlock     = crowdedStageBlock
)

// cacheDir is where Linux describes cpu0's caches.
const cacheDir = "/sys/devices/system/cpu/cpu0/cache"

// stageBlockSource is where rank 0 takes the staging block of a group of
// ranks ranks whose segments go in dir from (a test sets it).
var stageBlockSource = func(ranks int, dir string) int {
	return stageBlockFor(ranks, runtime.NumCPU(), stageBlockSize(), func() (int64, error) { return sharedFree(dir) })
}

// stageBlockFor returns the staging block of a group of ranks ranks on a
// machine of cpus CPUs whose cache chose the block cache: cache, unless
// the ranks outnumber the CPUs and /dev/shm (whose free bytes free
// returns) holds twice the larger segment, in which case
// crowdedStageBlock.
//
// Ranks that take turns on the CPUs gain nothing from blocks that stay in
// a cache, since a rank's block is evicted by the next rank to run on
// that CPU, and every block costs a barrier at which some ranks sleep and
// a CPU may idle until the last arrives. Four ranks on two cores with
// 1 MiB of level-2 cache each (2026-12-02, tandem bench allreduce -nproc 4
// -iters 20, three alternating runs): at 64 MiB 61.6-67.2 ms in blocks of
// 2 MiB, 48.7-55.3 in 8 MiB, 44.9-52.1 in 16 MiB; at 16 MiB 15.8-16.8,
// 10.4-15.7 and 12.3-13.7 ms. The CPUs idled 14%, 11% and 7% of a run of
// 40 all-reduces of 64 MiB. On another such machine (AMD Zen 4, the same
// evening, six alternating runs of each pair) 32 MiB blocks took 36.4-46.1
// ms at 64 MiB against 45.3-50.1 in 16 MiB, and 11.2-12.8 ms at 16 MiB
// against 12.4-13.9; 64 MiB blocks were no better than 32 (41.1-49.7 and
// 11.7 ms). A segment of 32 MiB blocks is 96 MiB a rank; /dev/shm must
// hold twice that, so that a group's staging leaves room for the shm
// transport's rings, shared tensors and other groups; where it is short,
// the cache's block keeps the segment small.
func stageBlockFor(ranks, cpus, cache int, free func() (int64, error)) int {
	if ranks <= cpus || cache >= crowdedStageBlock {
		return cache
	}
	need := int64(ranks) * (stageHeader + stageBuffers*crowdedStageBlock)
	if avail, err := free(); err != nil || avail < 2*need {
		return cache
	}
	return crowdedStageBlock
}

// stageBlockSize returns this machine's staging block: the size of cpu0's
// level-2 data (or unified) cache, within [minStageBlock, maxCacheBlock]
// and rounded down to a page, or defaultStageBlock where the system does
// not say.
func stageBlockSize() int {
	return stageBlockFrom(cacheDir)
}

// stageBlockFrom is stageBlockSize reading the cache descriptions under
// dir (index0, index1, ... with level, type and size files).
func stageBlockFrom(dir string) int {
	entries, err := filepath.Glob(filepath.Join(dir, "index*"))
	if err != nil {
		return defaultStageBlock
	}
	for _, e := range entries {
		if readTrim(filepath.Join(e, "level")) != "2" {
			continue
		}
		if t := readTrim(filepath.Join(e, "type")); t != "Data" && t != "Unified" {
			continue
		}
		n, err := bytesize.Parse(readTrim(filepath.Join(e, "size")))
		if err != nil {
			return defaultStageBlock
		}
		return min(max(n, minStageBlock), maxCacheBlock) &^ 4095
	}
	return defaultStageBlock
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
