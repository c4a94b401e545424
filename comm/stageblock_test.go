package comm

import (
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

// SetStageBlockSource has rank 0 take the staging block from f until the
// returned function restores the machine's (for TestStageBlockAgreed).
func SetStageBlockSource(f func() int) (restore func()) {
	prev := stageBlockSource
	stageBlockSource = f
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
