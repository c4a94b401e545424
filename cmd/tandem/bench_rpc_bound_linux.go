//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/internal/futex"
	"github.com/tandemml/tandem/internal/samehost"
)

// The bound of the echo (`tandem bench rpc -bound`): two processes of this
// machine that hand a tensor of bytes back and forth with the copies alone,
// as the pushed echo makes them, and nothing else: no RPC, no socket, no
// collector (nothing is allocated while it runs), waits that poll and never
// park. Each way, the receiver copies the first half out of the sender's
// memory (process_vm_readv) while the sender writes the second half into
// the receiver's (process_vm_writev). Every round goes between the same
// buffers, warm in the caches: the copies at their fastest here. (Received
// into eight buffers in turn instead, the 4 MiB round trip's p50 was 0.83
// to 0.94 ms against 0.33 to 0.35, and its p99 over p50 1.34 to 1.39.) The two share a page of flags, a
// file in /dev/shm that the first creates and the second maps; the second
// is this binary started as `tandem bench rpc -bound-peer=PATH`. Its p99
// over its p50 is what this machine allows the echo's.

// The flag page's words (uint64 each).
const (
	boundCallerPID = iota // the timing process's pid
	boundPeerPID          // the second process's pid, set once it is ready
	boundCallerIn         // where the timing process receives
	boundCallerOut        // where the timing process's tensor lies
	boundPeerBuf          // where the second process receives, and sends from
	boundSize             // bytes each way
	boundRounds           // round trips in all
	boundSent             // round r's tensor is ready to copy (the timing process)
	boundSentTail         // round r's second half is written (the timing process)
	boundBack             // round r arrived, and its reply is ready (the second process)
	boundBackTail         // round r's reply's second half is written (the second process)
	boundFinished         // the timing process has read the last reply: the second may exit
)

// boundStall bounds how long either side waits for the other's flag;
// boundLook is how long it polls between looks at whether the other is
// still there.
const (
	boundStall = 10 * time.Second
	boundLook  = time.Millisecond
)

type boundPage struct {
	mem []byte
}

func (p boundPage) word(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[8*i]))
}

// wait polls word i until it reaches v, yielding between looks, and fails
// once gone reports that the other process has ended or boundStall passes.
func (p boundPage) wait(i int, v uint64, gone func() bool) error {
	reached := func() bool { return p.word(i).Load() >= v }
	start := time.Now()
	for !reached() && !futex.Poll(boundLook, reached) {
		if gone() {
			return errors.New("the other process of the bound ended")
		}
		if time.Since(start) > boundStall {
			return fmt.Errorf("the other process of the bound did not answer within %v", boundStall)
		}
	}
	return nil
}

func mapBoundPage(f *os.File) (boundPage, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return boundPage{}, fmt.Errorf("mapping the bound's flags: %w", err)
	}
	return boundPage{mem}, nil
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// filledBuffer returns n bytes, every page written.
func filledBuffer(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// rpcBound times iters round trips of bytes each way (after warm warm-up
// ones) between this process and a second one that start launches with
// the flags it is given; the second runs with GOMAXPROCS cores (0: the
// runtime's default), as this process does meanwhile.
func rpcBound(ctx context.Context, start workerLauncher, bytes, warm, iters, cores int) ([]time.Duration, error) {
	if bytes < 2 || iters < 1 {
		return nil, fmt.Errorf("the bound needs at least 2 bytes and 1 round trip")
	}
	if cores > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(cores))
	}
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "tandem-bound-*")
	if err != nil {
		return nil, fmt.Errorf("the bound's flags: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(4096); err != nil {
		return nil, fmt.Errorf("the bound's flags: %w", err)
	}
	page, err := mapBoundPage(f)
	if err != nil {
		return nil, err
	}
	defer syscall.Munmap(page.mem)
	in, out := filledBuffer(bytes), filledBuffer(bytes)
	rounds := uint64(warm + iters)
	page.word(boundCallerPID).Store(uint64(os.Getpid()))
	page.word(boundCallerIn).Store(addrOf(in))
	page.word(boundCallerOut).Store(addrOf(out))
	page.word(boundSize).Store(uint64(bytes))
	page.word(boundRounds).Store(rounds)

	cmd, err := start([]string{"-bound-peer=" + f.Name()}, nil)
	if err != nil {
		return nil, fmt.Errorf("starting the bound's second process: %w", err)
	}
	if cores > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(cores))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the bound's second process: %w", err)
	}
	var exited atomic.Bool
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		exited.Store(true)
		waited <- err
	}()
	gone := func() bool { return exited.Load() || ctx.Err() != nil }
	fail := func(err error) ([]time.Duration, error) {
		cmd.Process.Kill()
		<-waited
		return nil, err
	}
	if err := page.wait(boundPeerPID, 1, gone); err != nil {
		return fail(err)
	}
	pid := int(page.word(boundPeerPID).Load())
	peerBuf := page.word(boundPeerBuf).Load()
	half := bytes / 2
	times := make([]time.Duration, 0, iters)
	for r := uint64(1); r <= rounds; r++ {
		t0 := time.Now()
		page.word(boundSent).Store(r)
		if err := samehost.Write(pid, peerBuf+uint64(half), out[half:]); err != nil {
			return fail(fmt.Errorf("writing into the bound's second process: %w", err))
		}
		page.word(boundSentTail).Store(r)
		if err := page.wait(boundBack, r, gone); err != nil {
			return fail(err)
		}
		if err := samehost.ReadAlone(pid, in[:half], peerBuf); err != nil {
			return fail(fmt.Errorf("reading from the bound's second process: %w", err))
		}
		if err := page.wait(boundBackTail, r, gone); err != nil {
			return fail(err)
		}
		if r > uint64(warm) {
			times = append(times, time.Since(t0))
		}
	}
	page.word(boundFinished).Store(rounds)
	if err := <-waited; err != nil {
		return nil, fmt.Errorf("the bound's second process: %w", err)
	}
	if in[0] != out[0] || in[bytes-1] != out[bytes-1] {
		return nil, fmt.Errorf("the bound's tensor came back changed")
	}
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	return times, nil
}

// rpcBoundPeer is the bound's second process: it maps the flags at path,
// and answers the rounds the timing process asks for.
func rpcBoundPeer(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("the bound's flags: %w", err)
	}
	defer f.Close()
	page, err := mapBoundPage(f)
	if err != nil {
		return err
	}
	defer syscall.Munmap(page.mem)
	pid := int(page.word(boundCallerPID).Load())
	bytes := int(page.word(boundSize).Load())
	rounds := page.word(boundRounds).Load()
	if pid <= 0 || bytes < 2 || rounds < 1 || bytes > 1<<30 {
		return fmt.Errorf("the bound's flags at %s name no run (pid %d, %d bytes, %d rounds)", path, pid, bytes, rounds)
	}
	callerIn, callerOut := page.word(boundCallerIn).Load(), page.word(boundCallerOut).Load()
	buf := filledBuffer(bytes)
	page.word(boundPeerBuf).Store(addrOf(buf))
	page.word(boundPeerPID).Store(uint64(os.Getpid()))
	// The timing process started this one: once it has gone, this one's
	// parent is another.
	gone := func() bool { return ctx.Err() != nil || os.Getppid() != pid }
	half := bytes / 2
	for r := uint64(1); r <= rounds; r++ {
		if err := page.wait(boundSent, r, gone); err != nil {
			return err
		}
		if err := samehost.ReadAlone(pid, buf[:half], callerOut); err != nil {
			return fmt.Errorf("reading from the timing process: %w", err)
		}
		if err := page.wait(boundSentTail, r, gone); err != nil {
			return err
		}
		page.word(boundBack).Store(r)
		if err := samehost.Write(pid, callerIn+uint64(half), buf[half:]); err != nil {
			return fmt.Errorf("writing into the timing process: %w", err)
		}
		page.word(boundBackTail).Store(r)
	}
	// The timing process reads the last reply's first half out of buf.
	if err := page.wait(boundFinished, rounds, gone); err != nil {
		return err
	}
	runtime.KeepAlive(buf)
	return nil
}
