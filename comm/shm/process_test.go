package shm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
	"gorgonia.org/tensor"
)

// Environment of a re-executed test binary that acts as one rank of a
// world whose store rank 0 serves.
const (
	envAddr    = "TANDEM_SHM_TEST_STORE"
	envRank    = "TANDEM_SHM_TEST_RANK"
	envWorld   = "TANDEM_SHM_TEST_WORLD"
	envRole    = "TANDEM_SHM_TEST_ROLE"
	envBackend = "TANDEM_SHM_TEST_BACKEND"
	envSize    = "TANDEM_SHM_TEST_SIZE"
)

// TestHelperRank is not a test: it is a peer rank of the tests and
// benchmarks below, in its own process, doing what envRole says.
func TestHelperRank(t *testing.T) {
	addr := os.Getenv(envAddr)
	if addr == "" {
		t.Skip("peer process for the multi-process tests and benchmarks")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	world, _ := strconv.Atoi(os.Getenv(envWorld))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(2)
	}
	tr, err := backendNamed(os.Getenv(envBackend)).Connect(ctx, transport.Config{Rank: rank, Size: world, Store: st, Token: "proc"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(2)
	}
	switch os.Getenv(envRole) {
	case "exit":
		// Take part in one exchange, then die without closing anything.
		buf := make([]byte, 8)
		if err := tr.Recv(ctx, 0, 1, buf); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	case "stop":
		// Answer once, then wait to be stopped and killed.
		buf := make([]byte, 8)
		if tr.Recv(ctx, 0, 1, buf) != nil || tr.Send(ctx, 0, 2, buf) != nil {
			os.Exit(3)
		}
		time.Sleep(time.Minute)
		os.Exit(0)
	case "echo":
		// Echo messages until the peer goes away.
		size, _ := strconv.Atoi(os.Getenv(envSize))
		buf := make([]byte, size)
		bg := context.Background()
		for tr.Recv(bg, 0, 1, buf) == nil && tr.Send(bg, 0, 2, buf) == nil {
		}
		os.Exit(0)
	case "stage-kill", "stage-stop":
		// All-reduce through the group's staging segment until rank 0's
		// test kills or stops a rank and the all-reduces fail.
		pg, err := comm.NewProcessGroup(ctx, tr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(2)
		}
		x := tensor.New(tensor.WithShape(stagedElems), tensor.Of(tensor.Float32))
		for pg.AllReduce(ctx, x, comm.Sum).Wait(ctx) == nil {
		}
		os.Exit(0)
	case "allreduce":
		pg, err := comm.NewProcessGroup(ctx, tr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(2)
		}
		size, _ := strconv.Atoi(os.Getenv(envSize))
		x := tensor.New(tensor.WithShape(size/4), tensor.Of(tensor.Float32))
		n := tensor.New(tensor.WithShape(1), tensor.Of(tensor.Int64))
		bg := context.Background()
		for {
			if err := pg.Broadcast(bg, n, 0).Wait(bg); err != nil {
				os.Exit(4)
			}
			rounds := n.Data().([]int64)[0]
			if rounds == 0 {
				break
			}
			for range rounds {
				if err := pg.AllReduce(bg, x, comm.Sum).Wait(bg); err != nil {
					os.Exit(5)
				}
			}
		}
		pg.Close()
		os.Exit(0)
	}
	os.Exit(6)
}

func backendNamed(name string) transport.Backend {
	switch name {
	case "tcp":
		return tcp.NewBackend(tcp.WithHost("127.0.0.1"))
	case comm.AutoBackend:
		// comm.Init's default: it finds every rank on this host and
		// connects through shared memory.
		b, err := comm.Lookup(comm.AutoBackend)
		if err != nil {
			panic(err)
		}
		return b
	}
	return shm.NewBackend()
}

// startRanks serves a store, starts ranks 1..world-1 as processes of this
// test binary in the given role, and connects rank 0 through backend.
func startRanks(tb testing.TB, backend, role string, world int, extra ...string) (transport.Transport, store.Store, []*exec.Cmd) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	var cmds []*exec.Cmd
	for r := 1; r < world; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRank$")
		cmd.Env = append(os.Environ(), envAddr+"="+st.Addr(), envRank+"="+strconv.Itoa(r), envWorld+"="+strconv.Itoa(world),
			envRole+"="+role, envBackend+"="+backend)
		cmd.Env = append(cmd.Env, extra...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		cmds = append(cmds, cmd)
		tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	// The frozen-peer test wants a short peer timeout; the benchmarks keep
	// the default, which a loaded machine's scheduling delays cannot reach.
	var peerTimeout time.Duration
	if role == "stop" || role == "stage-stop" {
		peerTimeout = 500 * time.Millisecond
	}
	tr, err := backendNamed(backend).Connect(ctx, transport.Config{Rank: 0, Size: world, Store: st, Token: "proc",
		PeerTimeout: peerTimeout})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr, st, cmds
}

// TestPeerExits: a rank whose process exits without closing its transport
// fails the receives waiting on it with ErrPeerLost, promptly, instead of
// leaving them to hang; and the segment's name is gone from /dev/shm.
func TestPeerExits(t *testing.T) {
	tr, st, cmds := startRanks(t, "shm", "exit", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	name, err := st.Get(ctx, "shm/segment")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(string(name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("segment %s still has a name after every rank mapped it: %v", name, err)
	}
	if err := tr.Send(ctx, 1, 1, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	cmds[0].Wait()
	// A send larger than the ring waits for the dead rank to make room,
	// and notices it is gone.
	if err := tr.Send(ctx, 1, 3, make([]byte, 16<<20)); !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("a send to an exited rank that cannot fit the ring: got %v, want ErrPeerLost", err)
	}
	start := time.Now()
	err = tr.Recv(ctx, 1, 2, make([]byte, 8))
	if !errors.Is(err, transport.ErrPeerLost) || !errors.Is(err, comm.ErrPeerLost) {
		t.Fatalf("receive from an exited rank: got %v, want ErrPeerLost", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the exited rank was noticed after %v", d)
	}
	t.Log(err)
	if err := tr.Send(ctx, 1, 3, make([]byte, 8)); !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("a send to a rank known to have exited: got %v, want ErrPeerLost", err)
	}
}

// TestPeerFrozen: a rank that is stopped (SIGSTOP) stops beating; its
// peers' waits fail with ErrPeerLost once the peer timeout passes.
func TestPeerFrozen(t *testing.T) {
	tr, _, cmds := startRanks(t, "shm", "stop", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	buf := make([]byte, 8)
	if err := tr.Send(ctx, 1, 1, buf); err != nil {
		t.Fatal(err)
	}
	if err := tr.Recv(ctx, 1, 2, buf); err != nil {
		t.Fatal(err)
	}
	if err := cmds[0].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := tr.Recv(ctx, 1, 3, buf)
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("receive from a stopped rank: got %v, want ErrPeerLost", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the stopped rank was noticed after %v; its peer timeout is 500ms", d)
	}
	t.Log(err)
}

// TestSegmentFile: the segment is created 0600 and loses its name once
// every rank has mapped it; a rank with another token is refused.
func TestSegmentFile(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		tr  transport.Transport
		err error
	}
	first := make(chan result, 1)
	go func() {
		tr, err := shm.NewBackend().Connect(ctx, transport.Config{Rank: 0, Size: 2, Store: st, Token: "right"})
		first <- result{tr, err}
	}()
	name, err := st.Get(ctx, "shm/segment")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(string(name))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("segment mode %v, want 0600", fi.Mode().Perm())
	}
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := shm.NewBackend().Connect(short, transport.Config{Rank: 1, Size: 2, Store: st, Token: "wrong"}); !errors.Is(err, transport.ErrUnauthorized) {
		t.Errorf("connect with another token: got %v, want ErrUnauthorized", err)
	}
	tr1, err := shm.NewBackend().Connect(ctx, transport.Config{Rank: 1, Size: 2, Store: st, Token: "right"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr1.Close()
	r0 := <-first
	if r0.err != nil {
		t.Fatal(r0.err)
	}
	defer r0.tr.Close()
	if _, err := os.Stat(string(name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("segment %s still has a name after every rank mapped it: %v", name, err)
	}
	// The world works, messages larger than the ring included.
	big := make([]byte, 9<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	done := make(chan error, 1)
	go func() { done <- r0.tr.Send(ctx, 1, 5, big) }()
	got := make([]byte, len(big))
	if err := tr1.Recv(ctx, 0, 5, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != big[i] {
			t.Fatalf("byte %d: got %d, want %d", i, got[i], big[i])
		}
	}
}
