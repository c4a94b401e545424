package rpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/peercred"
	"github.com/tandemml/tandem/internal/samehost"
	"github.com/tandemml/tandem/internal/samehost/samehosttest"
	"github.com/tandemml/tandem/internal/wire"
)

// The attack of issue 12: a token holder asks a worker for same-host
// copies naming another process's memory (a victim's), then has the
// worker's echo function copy a secret out of it. Version 1 of the
// handshake took the process id from the hello; version 2 takes it only
// from the kernel, and only for a process of the worker's user that is at
// the other end of the TCP connection.

// victimEnv makes the test binary, re-executed, act as the victim
// (samehosttest.RunVictim).
const victimEnv = "TANDEM_RPC_TEST_VICTIM"

// attackerEnv makes the test binary, re-executed, run stealSecret against
// the worker and victim its value names, and print what came back.
const attackerEnv = "TANDEM_RPC_TEST_ATTACKER"

// TestHelperVictim is the victim process of the same-host copy attack
// tests (samehosttest.RunVictim); it does nothing in a normal test run.
func TestHelperVictim(t *testing.T) {
	samehosttest.RunVictim(victimEnv)
	t.Skip("runs only as the victim process of TestSameHostCopyTrustsOnlyTheKernel")
}

// TestHelperAttacker is the attacker process of the same-host copy attack
// tests; it does nothing in a normal test run.
func TestHelperAttacker(t *testing.T) {
	arg := os.Getenv(attackerEnv)
	if arg == "" {
		t.Skip("runs only as the attacker process of TestSameHostCopyTrustsOnlyTheKernel")
	}
	f := strings.Fields(arg)
	v, err := samehosttest.ParseVictim(strings.Join(f[2:], " "))
	if err != nil {
		fmt.Println("bad victim:", err)
		os.Exit(2)
	}
	got, err := stealSecret(f[0], []byte(f[1]), v, true, nil)
	if err != nil {
		fmt.Println("refused:", err)
	} else {
		fmt.Printf("got %x\n", got)
	}
	os.Exit(0)
}

// stealSecret speaks the handshake by hand, offering same-host copies with
// the victim's probe address and bytes as if they were its own, then sends
// an echo call whose tensor is "by reference" at the victim's secret. With
// prove it proves itself to the worker's challenge (as the process it is:
// it can be no other); without, it claims a proof it never made. It returns
// the tensor the worker echoed, or why it got none.
// before, when not nil, runs just before the call goes out.
func stealSecret(addr string, token []byte, v samehosttest.Victim, prove bool, before func()) ([]byte, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	mine := cmaHello{flags: cmaEnabled, boot: samehost.BootID(), addr: v.Addr, probe: v.Token}
	rand.Read(mine.challenge[:])
	status, _, err := dialAuth(nc, br, token, 0, mine.append(nil))
	if err != nil {
		return nil, err
	}
	if status != statusOK {
		return nil, fmt.Errorf("hello refused: status %d", status)
	}
	theirs, err := readCMAHello(br)
	if err != nil {
		return nil, err
	}
	if prove {
		if err := peercred.Prove(context.Background(), theirs.challenge[:], nc); err != nil {
			return nil, fmt.Errorf("proving: %v", err)
		}
	}
	if _, err := nc.Write([]byte{cmaSentProof}); err != nil {
		return nil, err
	}
	verdict, err := br.ReadByte()
	if err != nil {
		return nil, err
	}
	if before != nil {
		before()
	}
	if _, err := nc.Write(refEchoRequest(v.Addr+16, len(v.Secret))); err != nil {
		return nil, err
	}
	var hdr [wire.HeaderLen]byte
	f, err := wire.ReadFrame(br, hdr[:], 1<<20, func(b []byte) string { return string(b) }, nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("worker's verdict on reading this process: %d; no reply: %w", verdict, err)
	}
	if f.Kind != wire.KindResponse || len(f.Tensors) != 1 {
		return nil, fmt.Errorf("reply of kind %d with %d tensors", f.Kind, len(f.Tensors))
	}
	return f.Tensors[0].Header.Raw, nil
}

// refEchoRequest is an echo call whose one uint8 tensor of n bytes is "by
// reference" at addr.
func refEchoRequest(addr uint64, n int) []byte {
	enc := encodeValue(nil, WorkerInfo{}, dense([]int{n}, make([]uint8, n)))
	typ, err := enc.typ, enc.err
	if err != nil {
		panic(err)
	}
	head := wire.AppendString(nil, "echo")
	head = wire.AppendString(head, typ)
	head = binary.AppendUvarint(head, 0) // no timeout
	head = binary.AppendUvarint(head, 0) // no metadata
	head = binary.AppendUvarint(head, uint64(len(enc.enc.Payload())))
	head = append(head, enc.enc.Payload()...)
	code, _ := wire.DtypeCode(tensor.Uint8)
	head = binary.AppendUvarint(head, 1)
	head = append(head, code)
	head = binary.AppendUvarint(head, 1)
	head = binary.AppendUvarint(head, uint64(n))
	head = binary.AppendUvarint(head, addr)
	frame := make([]byte, wire.HeaderLen, wire.HeaderLen+len(head))
	binary.LittleEndian.PutUint32(frame[0:4], uint32(len(head)))
	frame[12], frame[14], frame[15] = wire.KindRequest, wire.Version, wire.FlagByRef|wire.FlagNoAck
	binary.LittleEndian.PutUint64(frame[16:24], 1)
	return append(frame, head...)
}

// serverReadsByRef reports whether any of a's incoming connections reads
// tensors from its peer's memory.
func serverReadsByRef(a *Agent) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range a.servers {
		if c.recvByRef {
			return true
		}
	}
	return false
}

// TestSameHostCopyTrustsOnlyTheKernel reproduces the attack: the worker
// could read the victim (the kernel allows it: same user here, or root),
// and the attacker names the victim's memory, yet the worker reads only
// the process the kernel names as its peer, so the secret never comes
// back. The attacker runs in this process and, where the test runs as
// root, in a process of user nobody, as in the report.
func TestSameHostCopyTrustsOnlyTheKernel(t *testing.T) {
	if !samehost.Supported || samehost.BootID() == ([16]byte{}) {
		t.Skip("same-host copies are not available here")
	}
	v := samehosttest.StartVictim(t, "TestHelperVictim", victimEnv)
	var probe [16]byte
	if err := samehost.Read(v.Pid, probe[:], v.Addr); err != nil || probe != v.Token {
		t.Skipf("this process may not read the victim's memory here (%v): nothing to protect", err)
	}
	agents := startGroup(t, 1, registerBasics)
	w := agents[0]
	addr := w.ln.Addr().String()
	attack := func(t *testing.T, prove bool) {
		var readsByRef bool
		got, err := stealSecret(addr, w.token, v, prove, func() { readsByRef = serverReadsByRef(w) })
		if bytes.Equal(got, v.Secret) {
			t.Fatalf("the worker copied the victim's secret out: %x", got)
		}
		if err == nil {
			t.Fatalf("the worker read something by reference for the attacker: %x", got)
		}
		if readsByRef {
			t.Fatal("the worker agreed to read the attacker's \"memory\"")
		}
		if !strings.Contains(err.Error(), "verdict on reading this process: 0") {
			t.Fatalf("attack: %v", err)
		}
		t.Logf("refused: %v", err)
	}
	t.Run("proving as itself", func(t *testing.T) { attack(t, true) })
	t.Run("claiming a proof it never made", func(t *testing.T) { attack(t, false) })
	t.Run("as nobody", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to run the attacker as another user")
		}
		bin := publicTestBinary(t)
		cmd := exec.Command(bin, "-test.run=^TestHelperAttacker$")
		cmd.Env = append(os.Environ(), attackerEnv+"="+addr+" "+string(w.token)+" "+v.Line)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("attacker: %v\n%s", err, out)
		}
		s := string(out)
		if strings.Contains(s, hex.EncodeToString(v.Secret)) {
			t.Fatalf("the worker copied the victim's secret out for nobody: %s", s)
		}
		if !strings.Contains(s, "refused:") || !strings.Contains(s, "verdict on reading this process: 0") {
			t.Fatalf("attacker as nobody: %s", s)
		}
		t.Logf("%s", strings.TrimSpace(s))
	})
	// The worker still serves honest callers, by same-host copies.
	two := startGroup(t, 2, registerBasics)
	x := dense([]int{cmaThreshold}, make([]uint8, cmaThreshold))
	if y, err := Sync[*tensor.Dense](context.Background(), two[0], "w1", "echo", x); err != nil || !sameTensor(x, y) {
		t.Fatalf("honest echo: %v", err)
	}
	if c := two[0].peers[1].cur.Load(); !c.sendByRef || !c.recvByRef || c.peerPID != os.Getpid() {
		t.Fatalf("honest workers: send %v recv %v pid %d", c.sendByRef, c.recvByRef, c.peerPID)
	}
}

// publicTestBinary returns a copy of the test binary that any user may run.
func publicTestBinary(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat(os.TempDir()); err != nil || st.Mode().Perm()&0o001 == 0 {
		t.Skipf("%s is not open to other users: no place for a binary they may run", os.TempDir())
	}
	dir, err := os.MkdirTemp("", "rpc-attacker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "rpc.test")
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
