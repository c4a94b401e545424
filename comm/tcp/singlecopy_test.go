package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/comm/transport/transporttest"
	"github.com/tandemml/tandem/internal/liveness"
	"github.com/tandemml/tandem/internal/nettest"
	"github.com/tandemml/tandem/internal/peercred"
	"github.com/tandemml/tandem/internal/samehost"
	"github.com/tandemml/tandem/internal/samehost/samehosttest"
)

// singleCopyHere reports whether this machine lets a process read its own
// memory with process_vm_readv, which every single-copy test needs.
func singleCopyHere(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("single-copy transfers are Linux-only")
	}
	src, dst := []byte("probe"), make([]byte, 5)
	if err := samehost.Read(os.Getpid(), dst, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(src))))); err != nil {
		t.Skipf("process_vm_readv is not allowed here: %v", err)
	}
}

// Ranks on one machine agree on single copies in both directions, unless
// one of them turns them off: then neither direction uses them.
func TestSingleCopyIsNegotiated(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 3, nil)
	for r, tr := range ts {
		for q, p := range tr.peers {
			if q == r {
				continue
			}
			if !p.refOut || p.refPID != os.Getpid() {
				t.Errorf("rank %d -> %d: refOut %v, refPID %d; want true, %d", r, q, p.refOut, p.refPID, os.Getpid())
			}
		}
	}
	mixed := connectAllWith(t, func(r int) Backend {
		if r == 0 {
			return streamOnly
		}
		return loopback
	}, 2, nil)
	for r, tr := range mixed {
		p := tr.peers[1-r]
		if p.refOut || p.refPID != 0 {
			t.Errorf("rank %d with single copies off on rank 0: refOut %v, refPID %d; want false, 0", r, p.refOut, p.refPID)
		}
	}
	ctx := ctxTimeout(t, 20*time.Second)
	exchange(t, ctx, mixed, 1, 0, 1, transporttest.Payload(9, 2*refMin), "stream fallback")
}

// Many large messages in both directions at once, on several tags: every
// acknowledgement finds its send, every payload arrives intact and in order.
func TestSingleCopyConcurrent(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 60*time.Second)
	const tags, rounds, size = 4, 6, refMin + 12345
	var wg sync.WaitGroup
	errc := make(chan error, 4*tags)
	for src := 0; src < 2; src++ {
		for tag := 0; tag < tags; tag++ {
			wg.Add(2)
			go func() {
				defer wg.Done()
				for i := 0; i < rounds; i++ {
					if err := ts[src].Send(ctx, 1-src, transport.Tag(tag), transporttest.Payload(src*100+tag*10+i, size)); err != nil {
						errc <- err
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				buf := make([]byte, size)
				for i := 0; i < rounds; i++ {
					if i == rounds/2 {
						time.Sleep(5 * time.Millisecond) // some arrive before their Recv
					}
					if err := ts[1-src].Recv(ctx, src, transport.Tag(tag), buf); err != nil {
						errc <- err
						return
					}
					if !bytes.Equal(buf, transporttest.Payload(src*100+tag*10+i, size)) {
						errc <- fmt.Errorf("%d->%d tag %d round %d: wrong payload", src, 1-src, tag, i)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// A message by reference that does not fit the receive buffer fails that
// Recv with ErrMismatch (stating both sizes) and leaves the link working;
// so does one above the receiver's size limit, with ErrTooLarge.
func TestSingleCopyWrongSizeAndTooLarge(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 2, func(rank int, cfg *transport.Config) {
		cfg.MaxMessage = 4 * refMin
		if rank == 0 {
			cfg.MaxMessage = 8 * refMin
		}
	})
	ctx := ctxTimeout(t, 20*time.Second)
	for _, posted := range []bool{true, false} {
		recv := func(tag transport.Tag, buf []byte) chan error {
			c := make(chan error, 1)
			go func() { c <- ts[1].Recv(ctx, 0, tag, buf) }()
			return c
		}
		var pending chan error
		if posted {
			pending = recv(1, make([]byte, refMin+8))
			time.Sleep(10 * time.Millisecond)
		}
		if err := ts[0].Send(ctx, 1, 1, transporttest.Payload(1, refMin)); err != nil {
			t.Fatalf("posted=%v: send: %v", posted, err)
		}
		if !posted {
			time.Sleep(10 * time.Millisecond) // the reader takes it into a buffer
			pending = recv(1, make([]byte, refMin+8))
		}
		err := <-pending
		if !errors.Is(err, transport.ErrMismatch) {
			t.Fatalf("posted=%v: want ErrMismatch, got %v", posted, err)
		}
		mustContain(t, err, fmt.Sprint(refMin), fmt.Sprint(refMin+8))
	}
	if err := ts[0].Send(ctx, 1, 2, transporttest.Payload(2, 6*refMin)); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Recv(ctx, 0, 2, make([]byte, 6*refMin)); !errors.Is(err, transport.ErrTooLarge) {
		t.Fatalf("oversized message by reference: want ErrTooLarge, got %v", err)
	}
	exchange(t, ctx, ts, 0, 1, 3, transporttest.Payload(3, 2*refMin), "after the failed receives")
}

// A send by reference to a rank that aborted fails with ErrPeerLost
// instead of waiting for an acknowledgement that never comes.
func TestSingleCopySendToAbortedPeer(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	ts[1].Abort(errors.New("gave up"))
	start := time.Now()
	err := ts[0].Send(ctx, 1, 1, transporttest.Payload(1, 2*refMin))
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("want ErrPeerLost, got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the send took %v to fail", d)
	}
}

// A Recv whose context ended before its message came leaves no trace: the
// message by reference goes to the next Recv.
func TestSingleCopyAfterTimedOutRecv(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 2, nil)
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ts[1].Recv(short, 0, 1, make([]byte, refMin)); !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	ctx := ctxTimeout(t, 20*time.Second)
	want := transporttest.Payload(4, refMin)
	errc := make(chan error, 1)
	go func() { errc <- ts[0].Send(ctx, 1, 1, want) }()
	got := make([]byte, refMin)
	if err := ts[1].Recv(ctx, 0, 1, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after a timed-out Recv: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// A reference that arrived before its Recv is copied by that Recv straight
// from the sender's memory when the Recv comes within refWait, and into a
// buffer by a timer otherwise; either way the payload arrives intact.
func TestSingleCopyQueuedReference(t *testing.T) {
	singleCopyHere(t)
	ts := connectAll(t, 2, nil)
	ctx := ctxTimeout(t, 20*time.Second)
	p := ts[1].peers[0]
	queued := func(tag transport.Tag) (ref, resolved bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if q := p.queues[tag]; q != nil && len(q.ready) > 0 {
			m := q.ready[0]
			return m.ref.id != 0, m.ref.id == 0 && m.copying != nil
		}
		return false, false
	}
	for _, late := range []bool{false, true} {
		tag := transport.Tag(1)
		if late {
			tag = 2
		}
		want := transporttest.Payload(int(tag), refMin)
		errc := make(chan error, 1)
		go func() { errc <- ts[0].Send(ctx, 1, tag, want) }()
		if !settle(func() bool { r, done := queued(tag); return r || done }) {
			t.Fatalf("late=%v: the reference never queued", late)
		}
		if late {
			if !settle(func() bool { _, done := queued(tag); return done }) {
				t.Fatalf("the timer never copied the reference")
			}
			if err := <-errc; err != nil {
				t.Fatalf("the send did not end when the timer copied its message: %v", err)
			}
		}
		got := make([]byte, refMin)
		if err := ts[1].Recv(ctx, 0, tag, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("late=%v: %v", late, err)
		}
		if !late {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
	}
}

// singleCopyPeerEnv makes a re-executed test binary act as rank 1 of
// TestSingleCopyBetweenProcesses, reaching rank 0's store at its value.
const singleCopyPeerEnv = "TANDEM_TCP_SINGLE_COPY_PEER"

// TestHelperSingleCopyPeer is not a test: it is rank 1 of
// TestSingleCopyBetweenProcesses, in a process of its own. It receives a
// large message and sends it back.
func TestHelperSingleCopyPeer(t *testing.T) {
	addr := os.Getenv(singleCopyPeerEnv)
	if addr == "" {
		t.Skip("peer process for TestSingleCopyBetweenProcesses")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 1, Size: 2, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	buf := make([]byte, 4<<20)
	if err := tr.Recv(ctx, 0, 1, buf); err != nil {
		t.Fatal(err)
	}
	if err := tr.Send(ctx, 0, 2, buf); err != nil {
		t.Fatal(err)
	}
	// Wait for rank 0 to have received it before closing.
	if err := tr.Recv(ctx, 0, 3, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
}

// Two processes on this machine move a large message by single copies in
// both directions.
func TestSingleCopyBetweenProcesses(t *testing.T) {
	singleCopyHere(t)
	ctx := ctxTimeout(t, 30*time.Second)
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSingleCopyPeer$")
	cmd.Env = append(os.Environ(), singleCopyPeerEnv+"="+st.Addr())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cmd.Wait(); err != nil {
			t.Errorf("peer process: %v\n%s", err, out.String())
		}
	}()
	tr, err := loopback.ConnectTCP(ctx, transport.Config{Rank: 0, Size: 2, Store: st})
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	defer tr.Close()
	if p := tr.peers[1]; !p.refOut || p.refPID != cmd.Process.Pid {
		t.Errorf("single copies not negotiated with the peer process: refOut %v, refPID %d (peer pid %d)", p.refOut, p.refPID, cmd.Process.Pid)
	}
	want := transporttest.Payload(5, 4<<20)
	if err := tr.Send(ctx, 1, 1, want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := tr.Recv(ctx, 1, 2, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("payload changed on its way to the other process and back")
	}
	if err := tr.Send(ctx, 1, 3, []byte{1}); err != nil {
		t.Fatal(err)
	}
}

// victimEnv makes a re-executed test binary act as the victim of
// TestSingleCopyTrustsOnlyTheKernel (samehosttest.RunVictim).
const victimEnv = "TANDEM_TCP_TEST_VICTIM"

// TestHelperSingleCopyVictim is not a test: it is the victim process of
// TestSingleCopyTrustsOnlyTheKernel.
func TestHelperSingleCopyVictim(t *testing.T) {
	samehosttest.RunVictim(victimEnv)
	t.Skip("victim process for TestSingleCopyTrustsOnlyTheKernel")
}

// hostileProbe is the probe of a rank that offers single copies with the
// victim's token address and bytes as if they were its own. With prove it
// proves itself to the honest rank's challenge (as the process it is: it
// can be no other); without, it claims a proof it never made.
func hostileProbe(c net.Conn, v samehosttest.Victim, prove bool) error {
	var rec [probeSize]byte
	copy(rec[0:4], probeMagic[:])
	rec[4] = 1
	binary.LittleEndian.PutUint64(rec[8:], v.Addr)
	copy(rec[16:32], v.Token[:])
	rand.Read(rec[32:])
	if _, err := c.Write(rec[:]); err != nil {
		return err
	}
	var theirs [probeSize]byte
	if _, err := io.ReadFull(c, theirs[:]); err != nil {
		return err
	}
	if prove {
		if err := peercred.Prove(context.Background(), theirs[32:], c); err != nil {
			return err
		}
	}
	var b [1]byte
	if _, err := c.Write([]byte{1}); err != nil { // "proved"
		return err
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if _, err := c.Write([]byte{0}); err != nil { // verdict
		return err
	}
	_, err := io.ReadFull(c, b[:])
	return err
}

// TestSingleCopyTrustsOnlyTheKernel: a rank that names another process's
// memory as its own (a victim's, which this process may read) gets no
// single copy of it: the honest rank reads only the process the kernel
// names as its peer, and a reference frame pointing at the victim's secret
// fails the link instead of delivering the secret.
func TestSingleCopyTrustsOnlyTheKernel(t *testing.T) {
	singleCopyHere(t)
	v := samehosttest.StartVictim(t, "TestHelperSingleCopyVictim", victimEnv)
	var probe [16]byte
	if err := samehost.Read(v.Pid, probe[:], v.Addr); err != nil || probe != v.Token {
		t.Skipf("this process may not read the victim's memory here (%v): nothing to protect", err)
	}
	for _, prove := range []bool{true, false} {
		t.Run(map[bool]string{true: "proving as itself", false: "claiming a proof it never made"}[prove], func(t *testing.T) {
			honest, hostile := nettest.TCPPair(t)
			ctx := ctxTimeout(t, 20*time.Second)
			errc := make(chan error, 1)
			go func() { errc <- hostileProbe(hostile, v, prove) }()
			host, err := loopback.probe(ctx, honest)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if host.pid != 0 {
				t.Fatalf("the honest rank agreed to read pid %d (victim %d, this process %d)", host.pid, v.Pid, os.Getpid())
			}
			// The hostile rank sends a reference to the secret anyway.
			tr := newTransport(0, 2, DefaultMaxMessage, liveness.Config{})
			tr.start([]*net.TCPConn{nil, honest}, []sameHost{{}, host})
			defer tr.Close()
			var frame [headerSize + refBodySize]byte
			hdr := (*[headerSize]byte)(frame[:headerSize])
			putHeader(hdr, frameRef, 7, uint64(len(v.Secret)))
			binary.LittleEndian.PutUint64(frame[headerSize:], v.Addr+16)
			binary.LittleEndian.PutUint64(frame[headerSize+8:], 1)
			if _, err := hostile.Write(frame[:]); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(v.Secret))
			err = tr.Recv(ctx, 1, 7, got)
			if bytes.Equal(got, v.Secret) {
				t.Fatalf("the honest rank copied the victim's secret out: %x", got)
			}
			if !errors.Is(err, transport.ErrPeerLost) {
				t.Fatalf("a reference never agreed to: %v, want ErrPeerLost", err)
			}
			t.Logf("refused: %v", err)
		})
	}
}
