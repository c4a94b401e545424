package samehost

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/internal/nettest"
)

// readable skips the test where this process may not read its own memory
// with process_vm_readv.
func readable(t *testing.T) {
	t.Helper()
	if !Supported {
		t.Skip("no process_vm_readv here")
	}
	src, dst := []byte("probe"), make([]byte, 5)
	if err := Read(os.Getpid(), dst, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(src))))); err != nil {
		t.Skipf("process_vm_readv is not allowed here: %v", err)
	}
}

// TestReadInPieces copies a buffer larger than one system call's piece,
// and fails cleanly on memory that is not mapped.
func TestReadInPieces(t *testing.T) {
	readable(t)
	src := make([]byte, 3*readPiece+123)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	dst := make([]byte, len(src))
	if err := Read(os.Getpid(), dst, uint64(uintptr(unsafe.Pointer(&src[0])))); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if dst[i] != src[i] {
			t.Fatalf("byte %d: %d, want %d", i, dst[i], src[i])
		}
	}
	runtime.KeepAlive(src)
	if err := Read(os.Getpid(), dst[:16], 8); err == nil {
		t.Fatal("reading address 8 succeeded")
	}
}

// TestOfferBothWays runs the probe between the two ends of one connection
// in this process: each proves itself to the other and reads the other's
// token, at the pid the kernel gives, which is this process's. A token
// that is not the one at the address fails, and so does an offer that is
// off.
func TestOfferBothWays(t *testing.T) {
	readable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := nettest.TCPPair(t)
	oa, ob := NewOffer(true), NewOffer(true)
	defer oa.Close()
	defer ob.Close()
	if !oa.Enabled() || !ob.Enabled() {
		t.Skip("no challenge socket here (peercred)")
	}
	if len(oa.Challenge()) != ChallengeSize || oa.Token() == ob.Token() {
		t.Fatalf("offers: challenge of %d bytes, tokens %x %x", len(oa.Challenge()), oa.Token(), ob.Token())
	}
	proved := make(chan bool, 1)
	go func() { proved <- ob.Prove(ctx, oa.Challenge(), b) }()
	if pid := oa.Verify(ctx, a, ob.Addr(), ob.Token()); pid != os.Getpid() {
		t.Fatalf("verify: pid %d, want %d", pid, os.Getpid())
	}
	if !<-proved {
		t.Fatal("prove failed")
	}
	// The right proof, the wrong token: no.
	go func() { proved <- oa.Prove(ctx, ob.Challenge(), a) }()
	wrong := ob.Token()
	wrong[0] ^= 1
	if pid := ob.Verify(ctx, b, oa.Addr(), wrong); pid != 0 {
		t.Fatalf("a wrong token passed (pid %d)", pid)
	}
	<-proved
	off := NewOffer(false)
	defer off.Close()
	if off.Enabled() || off.Challenge() != nil || off.Prove(ctx, oa.Challenge(), b) || off.Verify(ctx, b, oa.Addr(), oa.Token()) != 0 {
		t.Fatal("an offer that is off took part")
	}
}
