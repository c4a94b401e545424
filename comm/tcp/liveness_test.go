package tcp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// Liveness: a frozen or cut-off peer is failed within the peer timeout,
// with an error that says it is unresponsive; idle links stay up.

// loopbackBackend is the name under which these tests register the TCP
// backend pinned to 127.0.0.1, for comm.Init.
const loopbackBackend = "tcp-liveness-loopback"

func init() { comm.Register(loopbackBackend, tcp.NewBackend(tcp.WithHost("127.0.0.1"))) }

// blackhole is a TCP proxy on loopback that forwards both ways until cut,
// then silently swallows everything (bytes and the end of the stream),
// as a link that drops every packet does. Both ends keep their
// connections, and their kernels keep seeing acknowledgements from the
// proxy's, so only the silence shows that the link is gone.
type blackhole struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	// slow, when set, trickles the bytes through in pieces of 32 KiB
	// every 50 ms (about 650 KB/s); cutAfter > 0 cuts the link once that
	// many bytes have gone through.
	slow     atomic.Bool
	cutAfter atomic.Int64
	passed   atomic.Int64
	// stall, when set, stops reading altogether, so that the senders'
	// sockets fill up and their writes block, and holds back what a read
	// already under way returns, the end of the stream included.
	stall  atomic.Bool
	closed atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newBlackhole(t testing.TB, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	b.wg.Add(1)
	go b.serve()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) serve() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", b.target)
		if err != nil {
			in.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, in, out)
		b.mu.Unlock()
		b.wg.Add(2)
		go b.pipe(out, in)
		go b.pipe(in, out)
	}
}

func (b *blackhole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		if !b.waitUnstalled() {
			return
		}
		n, err := src.Read(buf)
		// A read that returns while the link is stalled (it was waiting
		// when the stall began) is held back: nothing, not even the end
		// of the stream, goes through a stalled link.
		if !b.waitUnstalled() {
			return
		}
		if b.cut.Load() {
			if err != nil {
				return
			}
			continue // swallowed
		}
		for data := buf[:n]; len(data) > 0; {
			piece := data
			if b.slow.Load() {
				piece = data[:min(len(data), 32<<10)]
				time.Sleep(50 * time.Millisecond)
			}
			if _, werr := dst.Write(piece); werr != nil {
				return
			}
			data = data[len(piece):]
			if c := b.cutAfter.Load(); c > 0 && b.passed.Add(int64(len(piece))) >= c {
				b.cut.Store(true)
				break
			}
		}
		if err != nil {
			if err == io.EOF {
				dst.(*net.TCPConn).CloseWrite()
			}
			return
		}
	}
}

// waitUnstalled waits while the link is stalled and reports whether the
// proxy is still open.
func (b *blackhole) waitUnstalled() bool {
	for b.stall.Load() {
		if b.closed.Load() {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func (b *blackhole) close() {
	b.closed.Store(true)
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// viaProxy is a rank's view of the rendezvous store in which the address
// that rank 0 published (key "…tcp/addr/0") leads through a blackhole, so
// that this rank's connection to rank 0 passes through it.
type viaProxy struct {
	store.Store
	t       testing.TB
	mu      sync.Mutex
	proxies *[]*blackhole
}

func (s *viaProxy) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := s.Store.Get(ctx, key)
	if err != nil || !strings.HasSuffix(key, "tcp/addr/0") {
		return v, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := newBlackhole(s.t, string(v)) // WithHost: one address
	*s.proxies = append(*s.proxies, p)
	return []byte(p.addr()), nil
}

// proxies0 is the first proxy made (the only one with two ranks); s.mu
// must be held.
func (s *viaProxy) proxies0() *blackhole { return (*s.proxies)[0] }

// cutAll cuts every proxy that viaProxy made.
func cutAll(mu *sync.Mutex, ps []*blackhole) {
	mu.Lock()
	defer mu.Unlock()
	for _, p := range ps {
		p.cut.Store(true)
	}
}

// connectCut connects two ranks whose link runs through a blackhole.
func connectCut(t *testing.T, opts ...tcp.Option) (ts [2]*tcp.Transport, cut func()) {
	ts, via := connectVia(t, opts...)
	return ts, func() { cutAll(&via.mu, *via.proxies) }
}

// connectVia connects two ranks whose link runs through a blackhole, and
// returns the store view that made it.
func connectVia(t *testing.T, opts ...tcp.Option) (ts [2]*tcp.Transport, via *viaProxy) {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	var proxies []*blackhole
	via = &viaProxy{Store: st, t: t, proxies: &proxies}
	b := tcp.NewBackend(append([]tcp.Option{tcp.WithHost("127.0.0.1")}, opts...)...)
	var wg sync.WaitGroup
	var errs [2]error
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s store.Store = st
			if r == 1 {
				s = via
			}
			ts[r], errs[r] = b.ConnectTCP(context.Background(), transport.Config{Rank: r, Size: 2, Store: s, Timeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: connect: %v", r, err)
		}
	}
	t.Cleanup(func() { closeAll(ts[:]) })
	return ts, via
}

// A link that goes silent mid-conversation fails on both sides within
// about the peer timeout, with an error wrapping ErrPeerLost that calls
// the peer unresponsive and says since when; Close then leaves nothing
// behind.
func TestCutLinkFailsBothSides(t *testing.T) {
	baseG := runtime.NumGoroutine()
	const timeout = 1500 * time.Millisecond
	ts, cut := connectCut(t, tcp.WithPeerTimeout(timeout))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Traffic flows through the proxy first.
	if err := ts[0].Send(ctx, 1, 1, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := ts[1].Recv(ctx, 0, 1, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		err  error
		took time.Duration
	}
	var res [2]outcome
	var wg sync.WaitGroup
	start := time.Now()
	cut()
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := ts[r].Recv(ctx, 1-r, 2, make([]byte, 8))
			res[r] = outcome{err, time.Since(start)}
		}()
	}
	wg.Wait()
	for r, o := range res {
		t.Logf("rank %d noticed the cut after %v: %v", r, o.took.Round(10*time.Millisecond), o.err)
		if !errors.Is(o.err, transport.ErrPeerLost) {
			t.Fatalf("rank %d: want ErrPeerLost, got %v", r, o.err)
		}
		mustMention(t, o.err, fmt.Sprintf("rank %d is unresponsive", 1-r), "nothing received for", "since")
		if o.took > timeout+3*time.Second {
			t.Errorf("rank %d noticed after %v, want about the peer timeout %v", r, o.took, timeout)
		}
		if pe := ts[r].PeerError(1 - r); !errors.Is(pe, transport.ErrPeerLost) {
			t.Errorf("rank %d: PeerError(%d) = %v, want the unresponsive error", r, 1-r, pe)
		}
		// Later operations fail at once with the same error.
		if err := ts[r].Send(ctx, 1-r, 3, []byte{1}); !errors.Is(err, transport.ErrPeerLost) || !strings.Contains(err.Error(), "unresponsive") {
			t.Errorf("rank %d: send after the failure: %v", r, err)
		}
	}
	closeAll(ts[:])
	testkit.AssertNoLeak(t, baseG, testkit.Slack(4)) // 4: the proxy's, ended by cleanup
}

// Every byte read counts as a sign of life, not only whole frames: a
// payload that takes longer than the peer timeout to trickle in (with the
// sender's heartbeats queued behind it) is received intact.
func TestSlowPayloadIsNotSilence(t *testing.T) {
	const timeout = time.Second
	ts, via := connectVia(t, tcp.WithPeerTimeout(timeout), tcp.WithSameHostCopy(false))
	via.mu.Lock()
	via.proxies0().slow.Store(true)
	via.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 2 << 20 // about 3 s through the slowed proxy
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- ts[0].Send(ctx, 1, 1, want) }()
	got := make([]byte, size)
	if err := ts[1].Recv(ctx, 0, 1, got); err != nil {
		t.Fatalf("slow payload failed after %v: %v", time.Since(start), err)
	}
	took := time.Since(start)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("payload corrupted")
	}
	if took < 2*timeout {
		t.Fatalf("the payload took only %v; the test needs it to take well over the peer timeout %v", took, timeout)
	}
	t.Logf("%d bytes took %v with a peer timeout of %v", size, took.Round(10*time.Millisecond), timeout)
}

// A link cut while a payload streams into a posted Recv fails that Recv
// as unresponsive, within about the peer timeout.
func TestCutMidPayload(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	ts, via := connectVia(t, tcp.WithPeerTimeout(timeout), tcp.WithSameHostCopy(false))
	via.mu.Lock()
	via.proxies0().cutAfter.Store(1 << 20) // in the middle of the payload below
	via.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 8 << 20
	go ts[0].Send(ctx, 1, 1, make([]byte, size))
	start := time.Now()
	err := ts[1].Recv(ctx, 0, 1, make([]byte, size))
	took := time.Since(start)
	t.Logf("the Recv failed after %v: %v", took.Round(10*time.Millisecond), err)
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("want ErrPeerLost, got %v", err)
	}
	mustMention(t, err, "rank 0 is unresponsive", "since")
	if took > timeout+3*time.Second {
		t.Errorf("noticed after %v, want about %v", took, timeout)
	}
}

// A link that stops carrying anything while a large message is being
// written (the writer blocked on a full socket, holding the line) fails
// that blocked Send and the Recv waiting for it, both as unresponsive.
func TestStalledLinkFailsBlockedSend(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	ts, via := connectVia(t, tcp.WithPeerTimeout(timeout), tcp.WithSameHostCopy(false))
	via.mu.Lock()
	via.proxies0().stall.Store(true)
	via.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 64 << 20 // far more than the sockets on the way hold
	start := time.Now()
	var sendErr error
	var sendTook time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		sendErr = ts[0].Send(ctx, 1, 1, make([]byte, size))
		sendTook = time.Since(start)
	}()
	recvErr := ts[1].Recv(ctx, 0, 1, make([]byte, size))
	recvTook := time.Since(start)
	<-done
	t.Logf("Send failed after %v: %v", sendTook.Round(10*time.Millisecond), sendErr)
	t.Logf("Recv failed after %v: %v", recvTook.Round(10*time.Millisecond), recvErr)
	for _, c := range []struct {
		err  error
		took time.Duration
		peer int
	}{{sendErr, sendTook, 1}, {recvErr, recvTook, 0}} {
		if !errors.Is(c.err, transport.ErrPeerLost) {
			t.Fatalf("want ErrPeerLost, got %v", c.err)
		}
		mustMention(t, c.err, fmt.Sprintf("rank %d is unresponsive", c.peer))
		if c.took > timeout+3*time.Second {
			t.Errorf("noticed after %v, want about %v", c.took, timeout)
		}
	}
}

// With the check off (a negative peer timeout) a silent link is left to
// the operation's own deadline, as before.
func TestPeerTimeoutOff(t *testing.T) {
	ts, cut := connectCut(t, tcp.WithPeerTimeout(-1))
	if ts[0].PeerTimeout() >= 0 {
		t.Fatalf("PeerTimeout() = %v, want negative (off)", ts[0].PeerTimeout())
	}
	cut()
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	err := ts[0].Recv(ctx, 1, 1, make([]byte, 8))
	if !errors.Is(err, transport.ErrTimeout) || errors.Is(err, transport.ErrPeerLost) {
		t.Fatalf("want the Recv's own timeout, got %v", err)
	}
}

// An idle world keeps every link up for many peer timeouts: heartbeats
// carry it. Rank 0 checks more strictly than the others (whose heartbeat,
// left alone, comes only every second or so): its heartbeats ask them for
// more, and they oblige.
func TestIdleLinksStayUp(t *testing.T) {
	const world = 3
	st := store.NewMemory()
	defer st.Close()
	ts := make([]*tcp.Transport, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := time.Duration(0) // the default, 5 s
			if r == 0 {
				d = 900 * time.Millisecond
			}
			b := tcp.NewBackend(tcp.WithHost("127.0.0.1"), tcp.WithPeerTimeout(d))
			ts[r], errs[r] = b.ConnectTCP(context.Background(), transport.Config{Rank: r, Size: world, Store: st, Timeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer ts[r].Close()
	}
	if ts[0].PeerTimeout() != 900*time.Millisecond || ts[1].PeerTimeout() != tcp.DefaultPeerTimeout {
		t.Fatalf("peer timeouts %v and %v", ts[0].PeerTimeout(), ts[1].PeerTimeout())
	}
	time.Sleep(4 * time.Second) // more than three times rank 0's timeout
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r := range world {
		for q := range world {
			if q == r {
				continue
			}
			if pe := ts[r].PeerError(q); pe != nil {
				t.Fatalf("rank %d lost rank %d while idle: %v", r, q, pe)
			}
			if err := ts[r].Send(ctx, q, 9, []byte{byte(r)}); err != nil {
				t.Fatalf("rank %d → %d after idling: %v", r, q, err)
			}
			b := make([]byte, 1)
			if err := ts[q].Recv(ctx, r, 9, b); err != nil || b[0] != byte(r) {
				t.Fatalf("rank %d ← %d after idling: %v", q, r, err)
			}
		}
	}
}

// A group whose link between ranks 0 and 1 is cut in the middle of a
// stream of all-reduces aborts within about the peer timeout (set through
// comm.Init), on both sides of the cut and on the bystander, and every
// error calls a rank unresponsive instead of blaming a collective mismatch.
func TestCutLinkAbortsGroup(t *testing.T) {
	const world = 3
	const timeout = 1500 * time.Millisecond
	st := store.NewMemory()
	defer st.Close()
	var proxies []*blackhole
	via := &viaProxy{Store: st, t: t, proxies: &proxies}
	pgs := initWorld(t, world, func(r int) store.Store {
		if r == 1 {
			return via
		}
		return st
	}, comm.WithPeerTimeout(timeout))
	var cutAt atomic.Int64
	res := runAllReduces(pgs, func(iter int) {
		if iter == 20 {
			cutAt.Store(time.Now().UnixNano())
			cutAll(&via.mu, proxies)
		}
	})
	for r, o := range res {
		took := time.Duration(o.at.UnixNano() - cutAt.Load())
		t.Logf("rank %d failed %v after the cut (iteration %d): %v", r, took.Round(10*time.Millisecond), o.iter, o.err)
		if o.err == nil || cutAt.Load() == 0 {
			t.Fatalf("rank %d: the loop ended without the cut failing it: %v", r, o.err)
		}
		if !errors.Is(o.err, comm.ErrPeerLost) || errors.Is(o.err, comm.ErrMismatch) {
			t.Errorf("rank %d: want ErrPeerLost and no mismatch, got %v", r, o.err)
		}
		if !strings.Contains(o.err.Error(), "rank 1 is unresponsive") && !strings.Contains(o.err.Error(), "rank 0 is unresponsive") {
			t.Errorf("rank %d: error does not call rank 0 or 1 unresponsive: %v", r, o.err)
		}
		if strings.Contains(o.err.Error(), "never joined") {
			t.Errorf("rank %d: error blames a collective mismatch: %v", r, o.err)
		}
		// Well below the default peer timeout (5 s), so WithPeerTimeout
		// reached the transport.
		if took > 4500*time.Millisecond {
			t.Errorf("rank %d failed %v after the cut, want about %v", r, took, timeout)
		}
	}
}

// initWorld runs comm.Init for world ranks in this process, each through
// its own view of the store.
func initWorld(t *testing.T, world int, storeFor func(r int) store.Store, opts ...comm.InitOption) []*comm.ProcessGroup {
	t.Helper()
	pgs := make([]*comm.ProcessGroup, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			o := append([]comm.InitOption{comm.WithStore(storeFor(r)), comm.WithRank(r), comm.WithWorldSize(world),
				comm.WithBackend(loopbackBackend), comm.WithToken("liveness"), comm.WithoutDefault()}, opts...)
			pgs[r], errs[r] = comm.Init(ctx, "env://", o...)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: init: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, pg := range pgs {
			pg.Close()
		}
	})
	return pgs
}

// loopOutcome is how a rank's stream of collectives ended.
type loopOutcome struct {
	err  error
	iter int
	at   time.Time
}

// runAllReduces has every group all-reduce small tensors in a loop until
// one fails (at most a minute); rank 0 calls hook before each iteration.
func runAllReduces(pgs []*comm.ProcessGroup, hook func(iter int)) []loopOutcome {
	res := make([]loopOutcome, len(pgs))
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r] = allReduceLoop(pg, func(i int) {
				if r == 0 && hook != nil {
					hook(i)
				}
			})
		}()
	}
	wg.Wait()
	return res
}

func allReduceLoop(pg *comm.ProcessGroup, hook func(iter int)) loopOutcome {
	x := tensor.New(tensor.WithShape(1024), tensor.Of(tensor.Float32))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		hook(i)
		if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
			return loopOutcome{err: err, iter: i, at: time.Now()}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// frozenEnv makes a re-executed test binary rank 1 of
// TestFrozenRankAbortsGroup; its value is the store's address.
const frozenEnv = "TANDEM_TCP_FROZEN_PEER"

// TestHelperFrozenRank is not a test: it is rank 1 of
// TestFrozenRankAbortsGroup, in a process of its own, which the test
// stops with SIGSTOP.
func TestHelperFrozenRank(t *testing.T) {
	addr := os.Getenv(frozenEnv)
	if addr == "" {
		t.Skip("rank 1 of TestFrozenRankAbortsGroup")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false, store.WithToken("liveness"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pg, err := comm.Init(ctx, "env://", comm.WithStore(st), comm.WithRank(1), comm.WithWorldSize(3),
		comm.WithBackend(loopbackBackend), comm.WithToken("liveness"), comm.WithoutDefault())
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	allReduceLoop(pg, func(int) {})
}

// A rank stopped with SIGSTOP in the middle of a stream of all-reduces
// (its kernel still acknowledges every byte) makes the other ranks fail
// within the default peer timeout, well under 10 s, with an error that
// calls it unresponsive instead of "never joined this collective".
func TestFrozenRankAbortsGroup(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("needs SIGSTOP")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken("liveness"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFrozenRank$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), frozenEnv+"="+srv.Addr())
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	pgs := make([]*comm.ProcessGroup, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for _, r := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pgs[r], errs[r] = comm.Init(ctx, "env://", comm.WithStore(srv), comm.WithRank(r), comm.WithWorldSize(3),
				comm.WithBackend(loopbackBackend), comm.WithToken("liveness"), comm.WithoutDefault())
		}()
	}
	wg.Wait()
	for _, r := range []int{0, 2} {
		if errs[r] != nil {
			t.Fatalf("rank %d: init: %v", r, errs[r])
		}
		defer pgs[r].Close()
	}
	var stoppedAt atomic.Int64
	res := runAllReduces([]*comm.ProcessGroup{pgs[0], pgs[2]}, func(iter int) {
		if iter == 20 {
			stoppedAt.Store(time.Now().UnixNano())
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Errorf("SIGSTOP: %v", err)
			}
		}
	})
	for i, o := range res {
		r := []int{0, 2}[i]
		took := time.Duration(o.at.UnixNano() - stoppedAt.Load())
		t.Logf("rank %d failed %v after rank 1 was stopped (iteration %d): %v", r, took.Round(10*time.Millisecond), o.iter, o.err)
		if o.err == nil || stoppedAt.Load() == 0 {
			t.Fatalf("rank %d: the loop ended before rank 1 was stopped: %v", r, o.err)
		}
		if !errors.Is(o.err, comm.ErrPeerLost) {
			t.Errorf("rank %d: want ErrPeerLost, got %v", r, o.err)
		}
		mustMention(t, o.err, "rank 1 is unresponsive", "nothing received for", "since")
		if strings.Contains(o.err.Error(), "never joined") {
			t.Errorf("rank %d: error blames a collective mismatch: %v", r, o.err)
		}
		if took > 10*time.Second {
			t.Errorf("rank %d took %v to notice a frozen rank, want well under 10 s", r, took)
		}
	}
}

// closeAll closes transports concurrently: each waits a moment for a
// goodbye that a cut link never carries.
func closeAll(ts []*tcp.Transport) {
	var wg sync.WaitGroup
	for _, tr := range ts {
		wg.Add(1)
		go func() { defer wg.Done(); tr.Close() }()
	}
	wg.Wait()
}

func mustMention(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error mentioning %q, got nil", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}
