package peercred

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/nettest"
)

func linuxOnly(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		if _, err := NewChallenge(); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("NewChallenge on %s: %v, want ErrUnsupported", runtime.GOOS, err)
		}
		t.Skip("peer credentials are Linux-only")
	}
}

func newChallenge(t *testing.T) *Challenge {
	t.Helper()
	c, err := NewChallenge()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Both ends of a connection prove themselves to each other, both before
// either accepts, and each learns the other's process from the kernel.
func TestMutualProof(t *testing.T) {
	linuxOnly(t)
	a, b := nettest.TCPPair(t)
	ca, cb := newChallenge(t), newChallenge(t)
	ctx := ctxFor(t, 10*time.Second)
	if err := Prove(ctx, cb.Offer(), a); err != nil {
		t.Fatal(err)
	}
	if err := Prove(ctx, ca.Offer(), b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		c    *Challenge
		conn net.Conn
	}{{ca, a}, {cb, b}} {
		cred, err := s.c.Accept(ctx, s.conn)
		if err != nil {
			t.Fatal(err)
		}
		if cred.PID != os.Getpid() || cred.UID != os.Geteuid() {
			t.Fatalf("kernel says pid %d uid %d, want %d %d", cred.PID, cred.UID, os.Getpid(), os.Geteuid())
		}
	}
}

// Connections with a wrong nonce are dropped and the challenge goes on
// waiting for the right proof; a proof with the right nonce made for
// another TCP connection (a relayed offer, or a proxy between the two)
// ends the challenge at once, naming no process.
func TestWrongProofsAreDropped(t *testing.T) {
	linuxOnly(t)
	a, b := nettest.TCPPair(t)
	other, _ := nettest.TCPPair(t)
	c := newChallenge(t)
	ctx := ctxFor(t, 10*time.Second)

	wrong := c.Offer()
	wrong[len(wrong)-1] ^= 1
	if err := Prove(ctx, wrong, b); err != nil {
		t.Fatal(err)
	}
	uc, err := net.Dial("unix", socketName(c.offer[:nameSize])) // sends nothing
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if cred, err := c.Accept(short, a); !errors.Is(err, errs.Timeout) {
		t.Fatalf("wrong proofs only: %+v %v, want a timeout", cred, err)
	}

	c2 := newChallenge(t)
	bad := c2.Offer()
	bad[nameSize] ^= 0xff
	Prove(ctx, bad, b)
	Prove(ctx, c2.Offer(), b)
	cred, err := c2.Accept(ctx, a)
	if err != nil || cred.PID != os.Getpid() {
		t.Fatalf("the right proof after wrong ones: %+v %v", cred, err)
	}

	c3 := newChallenge(t)
	if err := Prove(ctx, c3.Offer(), other); err != nil { // relayed to another connection
		t.Fatal(err)
	}
	start := time.Now()
	cred, err = c3.Accept(ctx, a)
	if !errors.Is(err, errs.Unauthorized) || cred.PID != 0 {
		t.Fatalf("a proof for another connection: %+v %v, want ErrUnauthorized and no pid", cred, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("a proof for another connection was refused after %v, want at once", d)
	}
}

// Prove dials only challenge names, checks the offer's size, and fails
// where no challenge listens.
func TestProveErrors(t *testing.T) {
	linuxOnly(t)
	a, _ := nettest.TCPPair(t)
	ctx := ctxFor(t, 5*time.Second)
	if err := Prove(ctx, make([]byte, OfferSize-1), a); !errors.Is(err, errs.InvalidArgument) {
		t.Fatalf("short offer: %v", err)
	}
	if err := Prove(ctx, make([]byte, OfferSize), a); err == nil {
		t.Fatal("proved to a challenge that does not exist")
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	c := newChallenge(t)
	if err := Prove(ctx, c.Offer(), p1); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("proof over a pipe: %v", err)
	}
	if _, err := c.Accept(ctx, p2); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("accept over a pipe: %v", err)
	}
}

// proverEnv makes the test binary, re-executed, dial the TCP address in
// it, read an offer and prove itself.
const proverEnv = "TANDEM_PEERCRED_PROVER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(proverEnv); addr != "" {
		if err := prover(addr); err != nil {
			fmt.Fprintln(os.Stderr, "prover:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if addr := os.Getenv(challengerEnv); addr != "" {
		if err := challenger(addr); err != nil {
			fmt.Fprintln(os.Stderr, "challenger:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func prover(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	offer := make([]byte, OfferSize)
	if _, err := io.ReadFull(conn, offer); err != nil {
		return err
	}
	if err := Prove(ctx, offer, conn); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, conn) // until the challenger hangs up
	return err
}

// proveFrom runs a prover process with attr and returns what Accept made
// of its proof.
func proveFrom(t *testing.T, bin string, attr *syscall.SysProcAttr) (Cred, int, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), proverEnv+"="+ln.Addr().String())
	cmd.SysProcAttr = attr
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start the prover this way here: %v", err)
	}
	defer func() {
		if err := cmd.Wait(); err != nil {
			t.Errorf("prover: %v\n%s", err, out.String())
		}
	}()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	defer conn.Close()
	c := newChallenge(t)
	if _, err := conn.Write(c.Offer()); err != nil {
		t.Fatal(err)
	}
	cred, err := c.Accept(ctxFor(t, 10*time.Second), conn)
	return cred, cmd.Process.Pid, err
}

// publicBinary returns a copy of the test binary that any user may run.
func publicBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "peercred")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prover")
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// A prover in another process is identified by its real pid; one running
// as another user, or in another PID namespace, is refused however right
// its proof.
func TestProofFromAnotherProcess(t *testing.T) {
	linuxOnly(t)
	cred, pid, err := proveFrom(t, os.Args[0], nil)
	if err != nil || cred.PID != pid || cred.UID != os.Geteuid() {
		t.Fatalf("prover process %d: %+v %v", pid, cred, err)
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the other-user and other-namespace cases need root to set up")
		return
	}
	bin := publicBinary(t)
	t.Run("other user", func(t *testing.T) {
		cred, _, err := proveFrom(t, bin, &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}})
		if !errors.Is(err, errs.Unauthorized) || cred.UID != 65534 {
			t.Fatalf("prover running as nobody: %+v %v, want refused", cred, err)
		}
	})
	t.Run("nested PID namespace", func(t *testing.T) {
		// This process sees a process of a namespace nested in its own,
		// under the id it has here.
		cred, pid, err := proveFrom(t, bin, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
		if err != nil || cred.PID != pid {
			t.Fatalf("prover in a nested PID namespace, pid %d here: %+v %v", pid, cred, err)
		}
	})
	t.Run("outer PID namespace", func(t *testing.T) {
		// A challenger in a nested namespace cannot see this process: the
		// kernel reports pid 0 and the proof is refused.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), challengerEnv+"="+ln.Addr().String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		var out strings.Builder
		cmd.Stderr = &out
		if err := cmd.Start(); err != nil {
			t.Skipf("cannot start a process in a new PID namespace here: %v", err)
		}
		defer cmd.Wait()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
		conn, err := ln.Accept()
		if err != nil {
			cmd.Process.Kill()
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		offer := make([]byte, OfferSize)
		if _, err := io.ReadFull(conn, offer); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		if err := Prove(ctxFor(t, 10*time.Second), offer, conn); err != nil {
			t.Fatal(err)
		}
		verdict, _ := io.ReadAll(conn)
		if !strings.HasPrefix(string(verdict), "pid 0 ") || !strings.Contains(string(verdict), "cannot see into") {
			t.Fatalf("challenger in a nested PID namespace says %q, want pid 0 refused\n%s", verdict, out.String())
		}
	})
}

// challengerEnv makes the test binary, re-executed, dial the TCP address
// in it, send a challenge's offer, and write back what Accept made of the
// proof.
const challengerEnv = "TANDEM_PEERCRED_CHALLENGER"

func challenger(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	c, err := NewChallenge()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := conn.Write(c.Offer()); err != nil {
		return err
	}
	cred, err := c.Accept(ctx, conn)
	_, werr := fmt.Fprintf(conn, "pid %d uid %d: %v", cred.PID, cred.UID, err)
	return werr
}
