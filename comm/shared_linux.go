//go:build linux

package comm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"github.com/tandemml/tandem/comm/shm"
)

// sharedPrefix starts the names of the shared tensors' and staging
// segments.
const sharedPrefix = "tandem-tensor-"

// createShared creates, sizes and maps a segment of size bytes, mode 0600,
// and returns its name.
func createShared(dir string, size int) (string, []byte, error) {
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", nil, fmt.Errorf("drawing a segment name: %w", err)
	}
	name := sharedPrefix + hex.EncodeToString(rnd[:])
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("creating the segment: %w; check that %s exists and is writable (WithSharedDir)", err, dir)
	}
	defer f.Close()
	// Reserve the pages now: a tmpfs out of room under a sparse file kills
	// the process that touches a missing page with SIGBUS; this fails with
	// ENOSPC and a message instead.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		os.Remove(path)
		return "", nil, fmt.Errorf("reserving %d bytes in %s: %w; give it more room (docker run --shm-size), point WithSharedDir at a larger tmpfs, or use ordinary tensors", size, dir, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return "", nil, fmt.Errorf("mapping the segment: %w", err)
	}
	return name, mem, nil
}

// openShared maps the segment that rank 0 created under name, which must
// be one of createShared's names and size bytes long.
func openShared(dir, name string, size int) ([]byte, error) {
	if !strings.HasPrefix(name, sharedPrefix) || strings.ContainsAny(name, "/\\") || len(name) != len(sharedPrefix)+32 {
		return nil, fmt.Errorf("rank 0 sent %q, which is not a shared tensor's segment name", name)
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the segment's size: %w", err)
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("the segment is %d bytes, want %d", st.Size(), size)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the segment: %w", err)
	}
	return mem, nil
}

// removeShared removes a segment's name; the memory stays until the last
// member unmaps it.
func removeShared(dir, name string) { os.Remove(filepath.Join(dir, name)) }

// unmapShared unmaps a segment nobody has been handed yet.
func unmapShared(mem []byte) { syscall.Munmap(mem) }

// detachShared replaces the segment's mapping with private memory at the
// same address (mmap with MAP_FIXED replaces it in one step), and copies
// this rank's region back into it, so that the tensor keeps its values and
// its address.
func detachShared(s *sharedSeg) error {
	mine := s.region(s.rank)
	saved := append([]byte(nil), mine...)
	addr := uintptr(unsafe.Pointer(&s.mem[0]))
	_, _, e := syscall.Syscall6(syscall.SYS_MMAP, addr, uintptr(len(s.mem)), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_FIXED, ^uintptr(0), 0)
	if e != 0 {
		return fmt.Errorf("comm: closing a shared tensor: replacing its mapping: %w", e)
	}
	copy(mine, saved)
	return nil
}

// sharedFree returns the bytes free in dir, where the staging segment is
// made.
func sharedFree(dir string) (int64, error) { return shm.NewBackend(shm.WithDir(dir)).FreeBytes() }
