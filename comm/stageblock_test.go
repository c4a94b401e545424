package comm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStageBlockFrom: the staging block is the level-2 data or unified
// cache, within its bounds, and the default where the system does not say.
func TestStageBlockFrom(t *testing.T) {
	dir := t.TempDir()
	write := func(index, level, typ, size string) {
		d := filepath.Join(dir, index)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"level": level, "type": typ, "size": size} {
			if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := stageBlockFrom(dir); got != defaultStageBlock {
		t.Fatalf("no caches described: %d, want the default %d", got, defaultStageBlock)
	}
	write("index0", "1", "Data", "32K")
	write("index1", "1", "Instruction", "32K")
	write("index2", "2", "Unified", "512K")
	write("index3", "3", "Unified", "32768K")
	if got := stageBlockFrom(dir); got != 512<<10 {
		t.Fatalf("a 512K level-2 cache: %d", got)
	}
	write("index2", "2", "Unified", "64M")
	if got := stageBlockFrom(dir); got != 4<<20 {
		t.Fatalf("a 64M level-2 cache: %d, want the 4 MiB bound", got)
	}
	write("index2", "2", "Data", "100K")
	if got := stageBlockFrom(dir); got != 256<<10 {
		t.Fatalf("a 100K level-2 cache: %d, want the 256 KiB bound", got)
	}
	write("index2", "2", "Data", "lots")
	if got := stageBlockFrom(dir); got != defaultStageBlock {
		t.Fatalf("an unreadable size: %d, want the default", got)
	}
}

// TestStageBlockFor: ranks that outnumber the CPUs stage in the crowded
// block where /dev/shm holds twice its segment, and in the cache's block
// otherwise.
func TestStageBlockFor(t *testing.T) {
	const mib = 1 << 20
	room := func(n int64) func() (int64, error) { return func() (int64, error) { return n, nil } }
	segment := int64(4 * (stageHeader + stageBuffers*crowdedStageBlock))
	for _, c := range []struct {
		name               string
		ranks, cpus, cache int
		free               func() (int64, error)
		want               int
	}{
		{"as many ranks as CPUs", 2, 2, mib, room(1 << 40), mib},
		{"fewer ranks than CPUs", 2, 8, 512 << 10, room(1 << 40), 512 << 10},
		{"four ranks on two CPUs", 4, 2, mib, room(1 << 40), crowdedStageBlock},
		{"just room enough", 4, 2, mib, room(2 * segment), crowdedStageBlock},
		{"a byte short of twice the segment", 4, 2, mib, room(2*segment - 1), mib},
		{"free space unknown", 4, 2, mib, func() (int64, error) { return 0, errors.ErrUnsupported }, mib},
	} {
		if got := stageBlockFor(c.ranks, c.cpus, c.cache, c.free); got != c.want {
			t.Errorf("%s: %d ranks, %d CPUs, cache block %d: %d, want %d", c.name, c.ranks, c.cpus, c.cache, got, c.want)
		}
	}
}

// CrowdedStageBlock is the block of ranks that outnumber the CPUs.
const CrowdedStageBlock = crowdedStageBlock

// SetStageBlockSource has rank 0 take the staging block from f until the
// returned function restores the machine's (for TestStageBlockAgreed).
func SetStageBlockSource(f func() int) (restore func()) {
	prev := stageBlockSource
	stageBlockSource = func(int, string) int { return f() }
	return func() { stageBlockSource = prev }
}

// StageBlock is the block pg stages with, 0 before its first staged
// collective.
func StageBlock(pg *ProcessGroup) int {
	pg.stageMu.Lock()
	defer pg.stageMu.Unlock()
	if pg.stage == nil {
		return 0
	}
	return pg.stage.block
}
