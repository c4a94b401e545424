package ddp_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// smallTmpfs mounts a tmpfs of size bytes for the test and returns its
// directory, or false where the test may not mount (not root).
func smallTmpfs(t *testing.T, size int) (string, bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", false
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("mounting a tmpfs of %d bytes at %s as root: %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir, true
}
