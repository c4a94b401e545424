//go:build !linux

package ddp_test

import "testing"

// smallTmpfs reports that no tmpfs can be mounted here.
func smallTmpfs(t *testing.T, size int) (string, bool) { return "", false }
