//go:build linux

package samehost

import (
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Supported reports whether this platform has process_vm_readv(2).
const Supported = true

// remoteIovec is a struct iovec that names memory of another process: a
// plain address, which Go must not take for a pointer.
type remoteIovec struct {
	base uintptr
	len  uintptr
}

// readPiece bounds one process_vm_readv call. The calls are made as raw
// system calls, which keep their P (no hand-off to another thread, no
// wake-ups: a copy is short work, not a wait), so each is kept short enough
// (a fraction of a millisecond) not to hold up the scheduler or a garbage
// collection.
const readPiece = 1 << 20

// Read copies len(dst) bytes from address addr of process pid into dst with
// process_vm_readv(2): one copy, from the other process's memory straight
// into this one's. The process id must be one the kernel vouched for (see
// Offer.Verify), never one a peer stated.
func Read(pid int, dst []byte, addr uint64) error {
	if len(dst) >= splitFrom && runtime.GOMAXPROCS(0) > 1 {
		return readShared(pid, dst, addr)
	}
	return readSerial(pid, dst, addr)
}

// splitFrom is the size from which Read shares the copy with a second
// goroutine (readShared).
const splitFrom = 2 << 20

// readShared copies dst in pieces of readPiece that this goroutine and one
// helper take in turn from a shared counter, so a large copy runs on two
// cores where the second is free (a process waiting for a reply usually
// is). A helper that never gets a processor costs nothing: this goroutine
// takes every piece itself and only waits for a piece the helper started.
func readShared(pid int, dst []byte, addr uint64) error {
	pieces := int64((len(dst) + readPiece - 1) / readPiece)
	var (
		next   atomic.Int64
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
	)
	work := func() {
		for {
			i := next.Add(1) - 1
			if i >= pieces || failed.Load() != nil {
				return
			}
			lo := int(i) * readPiece
			hi := min(lo+readPiece, len(dst))
			if err := readSerial(pid, dst[lo:hi], addr+uint64(lo)); err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		work()
	}()
	work()
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

// ReadAlone is Read on this goroutine alone, never shared with a helper:
// for a copy that another process shares already (rpc's pushed tensors).
func ReadAlone(pid int, dst []byte, addr uint64) error { return readSerial(pid, dst, addr) }

// readSerial is Read on this goroutine alone.
func readSerial(pid int, dst []byte, addr uint64) error {
	return transfer(sysProcessVMReadv, pid, dst, addr)
}

// Write copies src into address addr of process pid with
// process_vm_writev(2), on this goroutine, in pieces of readPiece. As for
// Read, the process id must be one the kernel vouched for, and the address
// one that process named for the purpose: the kernel checks only that this
// process may write there, not that it should.
func Write(pid int, addr uint64, src []byte) error {
	return transfer(sysProcessVMWritev, pid, src, addr)
}

// transfer moves the bytes of local from or to addr in process pid with
// the process_vm_readv or process_vm_writev system call sysno.
func transfer(sysno uintptr, pid int, local []byte, addr uint64) error {
	for len(local) > 0 {
		piece := min(len(local), readPiece)
		liov := syscall.Iovec{Base: &local[0]}
		liov.SetLen(piece)
		riov := remoteIovec{base: uintptr(addr), len: uintptr(piece)}
		n, _, errno := syscall.RawSyscall6(sysno, uintptr(pid),
			uintptr(unsafe.Pointer(&liov)), 1, uintptr(unsafe.Pointer(&riov)), 1, 0)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return errno
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		local = local[n:]
		addr += uint64(n)
	}
	return nil
}
