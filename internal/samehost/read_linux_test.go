package samehost

import (
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"
)

// TestReadShared: a copy large enough to be shared between two goroutines
// arrives whole with one processor or several, and a source with a hole in
// the middle fails on either path instead of returning part of it.
func TestReadShared(t *testing.T) {
	readable(t)
	const size = 4*readPiece + 4096
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*13 + 5)
	}
	addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
	for _, procs := range []int{1, 2, 4} {
		prev := runtime.GOMAXPROCS(procs)
		dst := make([]byte, size)
		err := Read(os.Getpid(), dst, addr)
		runtime.GOMAXPROCS(prev)
		if err != nil {
			t.Fatalf("GOMAXPROCS %d: %v", procs, err)
		}
		for i := range dst {
			if dst[i] != mem[i] {
				t.Fatalf("GOMAXPROCS %d: byte %d is %d, want %d", procs, i, dst[i], mem[i])
			}
		}
	}
	// Unmap a page in the third piece: the copy must fail.
	hole := 2*readPiece + 8192
	if _, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, uintptr(addr)+uintptr(hole), 4096, 0); errno != 0 {
		t.Fatal(errno)
	}
	for _, procs := range []int{1, 2} {
		prev := runtime.GOMAXPROCS(procs)
		err := Read(os.Getpid(), make([]byte, size), addr)
		runtime.GOMAXPROCS(prev)
		if err == nil {
			t.Fatalf("GOMAXPROCS %d: reading across an unmapped page succeeded", procs)
		}
	}
}

// TestWrite: Write puts every byte where it was asked to, across pieces,
// and reports an unmapped page in the range as an error.
func TestWrite(t *testing.T) {
	readable(t)
	const size = 2*readPiece + 12345
	mem, err := syscall.Mmap(-1, 0, size+4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
	if err := Write(os.Getpid(), addr+100, src); err != nil {
		t.Fatal(err)
	}
	for i := range mem[:size+200] {
		want := byte(0)
		if i >= 100 && i < 100+size {
			want = src[i-100]
		}
		if mem[i] != want {
			t.Fatalf("byte %d is %d, want %d", i, mem[i], want)
		}
	}
	hole := readPiece + 8192
	if _, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, uintptr(addr)+uintptr(hole), 4096, 0); errno != 0 {
		t.Fatal(errno)
	}
	if err := Write(os.Getpid(), addr, src); err == nil {
		t.Fatal("writing across an unmapped page succeeded")
	}
}
