package comm

import (
	"os"
	"path/filepath"
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
const (
	stageRoom         = 2 << 20
	defaultStageBlock = 2 << 20 // where the cache's size is unknown
	minStageBlock     = 256 << 10
	maxStageBlock     = 4 << 20
)

// cacheDir is where Linux describes cpu0's caches.
const cacheDir = "/sys/devices/system/cpu/cpu0/cache"

// stageBlockSource is where rank 0 takes the staging block from (a test
// sets it).
var stageBlockSource = stageBlockSize

// stageBlockSize returns this machine's staging block: the size of cpu0's
// level-2 data (or unified) cache, within [minStageBlock, maxStageBlock]
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
		return min(max(n, minStageBlock), maxStageBlock) &^ 4095
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
