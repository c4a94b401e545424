//go:build !linux

package comm

import "errors"

// Shared tensors need Linux's /dev/shm here.

func createShared(dir string, size int) (string, []byte, error) {
	return "", nil, errors.ErrUnsupported
}

func openShared(dir, name string, size int) ([]byte, error) { return nil, errors.ErrUnsupported }

func removeShared(dir, name string) {}

func unmapShared(mem []byte) {}

func detachShared(s *sharedSeg) error { return nil }

func sharedFree(dir string) (int64, error) { return 0, errors.ErrUnsupported }
