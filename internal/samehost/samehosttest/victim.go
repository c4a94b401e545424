// Package samehosttest holds the victim process of the tests that attack
// same-host copies (comm/tcp's and rpc's): a process whose memory the test
// process may read, which an attacker names as its own; and the check that
// same-host copies are allowed here at all (SelfReadable).
package samehosttest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/samehost"
)

// Victim is what a victim process printed: its pid, the address of its 16
// token bytes, the token, and the 48-byte secret right after it.
type Victim struct {
	Pid    int
	Addr   uint64
	Token  [16]byte
	Secret []byte
	// Line is the line it printed, for handing on to another process
	// (ParseVictim reads it back).
	Line string
}

// RunVictim is the body of a test binary's helper test that acts as the
// victim when the environment variable env is set: it holds 16 token bytes
// and a 48-byte secret right after them, prints its pid, their address and
// both in hex, waits for its stdin to close and exits. Without env it
// returns at once (the helper test then skips).
func RunVictim(env string) {
	if os.Getenv(env) == "" {
		return
	}
	buf := make([]byte, 64)
	rand.Read(buf)
	fmt.Printf("%d %d %x %x\n", os.Getpid(), uintptr(unsafe.Pointer(&buf[0])), buf[:16], buf[16:])
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(buf)
	os.Exit(0)
}

// StartVictim re-executes the test binary as the victim, running the
// helper test named helper (which calls RunVictim(env)) with env set.
func StartVictim(t *testing.T, helper, env string) Victim {
	t.Helper()
	c := childtest.Start(t, "the victim", helper, env+"=1")
	v, err := ParseVictim(c.Line(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if v.Pid != c.Pid {
		t.Fatalf("victim says pid %d, is %d", v.Pid, c.Pid)
	}
	return v
}

// ParseVictim reads a victim's line.
func ParseVictim(line string) (Victim, error) {
	f := strings.Fields(line)
	if len(f) != 4 {
		return Victim{}, fmt.Errorf("victim line %q", line)
	}
	v := Victim{Line: strings.Join(f, " ")}
	var err error
	if v.Pid, err = strconv.Atoi(f[0]); err != nil {
		return v, err
	}
	if v.Addr, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return v, err
	}
	tok, err := hex.DecodeString(f[2])
	if err != nil || len(tok) != 16 {
		return v, fmt.Errorf("victim token %q", f[2])
	}
	copy(v.Token[:], tok)
	if v.Secret, err = hex.DecodeString(f[3]); err != nil || len(v.Secret) != 48 {
		return v, fmt.Errorf("victim secret %q", f[3])
	}
	return v, nil
}

// SelfReadable reports whether this process may copy its own memory with
// process_vm_readv: a sandbox may forbid it, and every same-host copy with it.
func SelfReadable() bool {
	src, dst := []byte{7}, []byte{0}
	return samehost.ReadAlone(os.Getpid(), dst, uint64(uintptr(unsafe.Pointer(&src[0])))) == nil && dst[0] == 7
}
