package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/testlog"
)

// childEnv selects what TestHelperNetnsChild does: "echo <host>" serves a
// TCP echo on host and prints "ADDR host:port"; "dial <host:port>" sends a
// line there, checks the echo and prints "OK".
const childEnv = "TANDEM_NETNS_TEST_CHILD"

func TestHelperNetnsChild(t *testing.T) {
	childtest.Main(childEnv, "netns test child", func(stop context.Context, value string) error {
		role, arg, _ := strings.Cut(value, " ")
		switch role {
		case "echo":
			ln, err := net.Listen("tcp", net.JoinHostPort(arg, "0"))
			if err != nil {
				return err
			}
			go func() {
				<-stop.Done()
				ln.Close()
			}()
			fmt.Printf("ADDR %s\n", ln.Addr())
			for {
				c, err := ln.Accept()
				if err != nil {
					if stop.Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer c.Close()
					io.Copy(c, c)
				}()
			}
		case "dial":
			if err := echoOnce(arg, 5*time.Second); err != nil {
				return err
			}
			fmt.Println("OK")
			<-stop.Done()
			return nil
		}
		return fmt.Errorf("unknown role %q", role)
	})
}

// echoOnce dials addr, sends a line and checks that it comes back.
func echoOnce(addr string, within time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, within)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(within))
	const msg = "hello over the bridge\n"
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg {
		return fmt.Errorf("echo: got %q, want %q", got, msg)
	}
	return nil
}

// child is a test binary running TestHelperNetnsChild inside a host.
type child struct {
	out  *bufio.Reader
	logs *testlog.Buffer
	name string
}

// startChild runs the helper with role inside h; the child is stopped (its
// stdin closed, then its context cancelled) when the test ends.
func startChild(t *testing.T, h *Host, role string) *child {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := h.Command(ctx, os.Args[0], "-test.run=^TestHelperNetnsChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{out: bufio.NewReader(stdout), logs: &testlog.Buffer{}, name: role + " in " + h.Name()}
	cmd.Stderr = c.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s: %v\n%s", c.name, err, c.logs)
			}
		case <-time.After(childtest.StopWait):
			cancel()
			<-exited
			t.Errorf("%s did not stop when its stdin closed", c.name)
		}
		cancel()
	})
	return c
}

// line reads the child's next line, which must start with word.
func (c *child) line(t *testing.T, word string) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := c.out.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		rest, ok := strings.CutPrefix(strings.TrimSpace(r.s), word)
		if r.err != nil || !ok {
			t.Fatalf("%s did not print %s (%q, %v):\n%s", c.name, word, r.s, r.err, c.logs)
		}
		return strings.TrimSpace(rest)
	case <-time.After(15 * time.Second):
		t.Fatalf("%s printed no %s line in 15s:\n%s", c.name, word, c.logs)
		return ""
	}
}

// startEcho runs an echo server in h and returns its address.
func startEcho(t *testing.T, h *Host) string {
	t.Helper()
	addr := startChild(t, h, "echo "+h.Addr()).line(t, "ADDR")
	if host, _, err := net.SplitHostPort(addr); err != nil || host != h.Addr() {
		t.Fatalf("echo server in %s listens on %q, want %s", h.Name(), addr, h.Addr())
	}
	return addr
}

func TestHostsConnect(t *testing.T) {
	nt := New(t, 2)
	hosts := nt.Hosts()
	if len(hosts) != 2 || hosts[0] != nt.Host(0) || hosts[1] != nt.Host(1) {
		t.Fatalf("Hosts() = %v, want the two hosts Host(0) and Host(1)", hosts)
	}
	subnet := netip.MustParsePrefix(nt.Subnet())
	seen := map[string]bool{}
	for _, a := range []string{nt.RootAddr(), hosts[0].Addr(), hosts[1].Addr()} {
		if !subnet.Contains(netip.MustParseAddr(a)) || seen[a] {
			t.Fatalf("address %s: not in %s or used twice", a, subnet)
		}
		seen[a] = true
	}
	if !strings.Contains(hosts[0].Name(), strconv.Itoa(os.Getpid())) {
		t.Errorf("namespace name %q does not carry the pid %d", hosts[0].Name(), os.Getpid())
	}

	// Host to host.
	addr := startEcho(t, hosts[0])
	startChild(t, hosts[1], "dial "+addr).line(t, "OK")

	// Root to host.
	if err := echoOnce(addr, 5*time.Second); err != nil {
		t.Fatalf("root to %s: %v", hosts[0].Name(), err)
	}

	// Host to root, where a store server would listen.
	ln, err := net.Listen("tcp", net.JoinHostPort(nt.RootAddr(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	startChild(t, hosts[1], "dial "+ln.Addr().String()).line(t, "OK")

	// The host's loopback is up.
	out, err := hosts[1].Command(context.Background(), nt.ip, "-o", "link", "show", "lo").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "UP") {
		t.Fatalf("lo in %s: %v: %s", hosts[1].Name(), err, out)
	}
}

func TestAddHost(t *testing.T) {
	nt := New(t, 1)
	addr := startEcho(t, nt.Host(0))
	h := nt.AddHost(t)
	if len(nt.Hosts()) != 2 || nt.Host(1) != h {
		t.Fatalf("after AddHost the net has %d hosts", len(nt.Hosts()))
	}
	startChild(t, h, "dial "+addr).line(t, "OK")
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestLinkDownUp(t *testing.T) {
	nt := New(t, 1)
	h := nt.Host(0)
	addr := startEcho(t, h)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string, within time.Duration) error {
		c.SetDeadline(time.Now().Add(within))
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err == nil && got != msg {
			return fmt.Errorf("got %q, want %q", got, msg)
		}
		return err
	}
	if err := roundTrip("before\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}

	if err := h.LinkDown(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := roundTrip("during\n", time.Second); !isTimeout(err) {
		t.Fatalf("a round trip over a link that is down: %v, want a timeout", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("a connect over a link that is down succeeded")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the failures took %v", el)
	}

	if err := h.LinkUp(); err != nil {
		t.Fatal(err)
	}
	if el := waitReachable(t, addr, 10*time.Second); el > 5*time.Second {
		t.Errorf("reachable again %v after LinkUp", el)
	}
	// The open connection recovers by retransmission: the line written
	// while the link was down arrives and comes back.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != "during\n" {
		t.Fatalf("the open connection after LinkUp: %q, %v", got, err)
	}
}

// waitReachable polls an echo at addr until a round trip works, failing the
// test after limit; it returns how long that took.
func waitReachable(t *testing.T, addr string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < limit {
		if err = echoOnce(addr, 300*time.Millisecond); err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not reachable within %v: %v", addr, limit, err)
	return 0
}

func TestCutFor(t *testing.T) {
	nt := New(t, 1)
	h := nt.Host(0)
	addr := startEcho(t, h)
	if err := echoOnce(addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const cut = 1500 * time.Millisecond
	start := time.Now()
	if err := h.CutFor(cut); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("CutFor took %v to return", el)
	}
	if err := echoOnce(addr, 300*time.Millisecond); err == nil && time.Since(start) < cut {
		t.Fatal("reachable right after CutFor")
	}
	waitReachable(t, addr, cut+8*time.Second)
	if el := time.Since(start); el < cut {
		t.Fatalf("reachable again %v after CutFor(%v)", el, cut)
	}

	// A LinkDown cancels the pending restore.
	if err := h.CutFor(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDown(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	if err := echoOnce(addr, 500*time.Millisecond); err == nil {
		t.Fatal("the link came back up after LinkDown cancelled the CutFor")
	}
	if err := h.LinkUp(); err != nil {
		t.Fatal(err)
	}
	waitReachable(t, addr, 10*time.Second)

	if err := h.CutFor(0); err == nil {
		t.Error("CutFor(0) did not fail")
	}
}

// transfer sends n bytes through the echo at addr and reads them back,
// returning how long that took.
func transfer(t *testing.T, addr string, n int) time.Duration {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(i)
	}
	start := time.Now()
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(buf)
		wrote <- err
	}()
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading the echo: %v", err)
	}
	el := time.Since(start)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != byte(i) {
			t.Fatalf("byte %d of the echo is %d", i, got[i])
		}
	}
	return el
}

func TestRateLimit(t *testing.T) {
	nt := New(t, 1)
	h := nt.Host(0)
	addr := startEcho(t, h)
	const n = 512 << 10
	const rate = 4_000_000 // bit/s: 512 KiB takes about 1.05 s each way
	free := transfer(t, addr, n)

	if err := h.RateLimit(rate); err != nil {
		t.Fatal(err)
	}
	limited := transfer(t, addr, n)
	want := time.Duration(float64(n*8) / rate * float64(time.Second))
	t.Logf("%d KiB echoed: %v unlimited, %v at %d bit/s (%v at the rate)", n>>10, free, limited, rate, want)
	if limited < want*6/10 {
		t.Errorf("at %d bit/s the echo took %v, want at least %v", rate, limited, want*6/10)
	}
	if limited < 4*free {
		t.Errorf("the limit did not slow the echo measurably: %v limited, %v unlimited", limited, free)
	}

	if err := h.ClearQdisc(); err != nil {
		t.Fatal(err)
	}
	if again := transfer(t, addr, n); again > limited/4 {
		t.Errorf("after ClearQdisc the echo took %v, as limited (%v)", again, limited)
	}
	if err := h.ClearQdisc(); err != nil {
		t.Errorf("ClearQdisc with nothing set: %v", err)
	}
	if err := h.RateLimit(0); err == nil {
		t.Error("RateLimit(0) did not fail")
	}
}

func TestNetem(t *testing.T) {
	nt := New(t, 1)
	h := nt.Host(0)
	addr := startEcho(t, h)
	const delay = 50 * time.Millisecond
	err := h.Netem(delay, 0)
	if !NetemAvailable() {
		if !errors.Is(err, ErrNoNetem) {
			t.Fatalf("Netem where the kernel has no netem: %v, want ErrNoNetem", err)
		}
		t.Logf("the kernel has no netem: %v", err)
		if err := echoOnce(addr, 5*time.Second); err != nil {
			t.Fatalf("the link after a failed Netem: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Netem where the kernel has netem: %v", err)
	}
	start := time.Now()
	if err := echoOnce(addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The connect and the echo are two round trips, each delayed both ways.
	if el := time.Since(start); el < 4*delay {
		t.Errorf("with %v of delay each way two round trips took %v", delay, el)
	}
	if err := h.ClearQdisc(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := echoOnce(addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el >= 2*delay {
		t.Errorf("after ClearQdisc two round trips took %v", el)
	}
}

// ownedNames returns the namespaces and root-namespace links whose names
// start with the given prefixes.
func ownedNames(t *testing.T, ip, nsp, ifp string) []string {
	t.Helper()
	nss, err := listNamespaces(ip)
	if err != nil {
		t.Fatal(err)
	}
	links, err := listLinks(ip)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, s := range nss {
		if strings.HasPrefix(s, nsp) {
			found = append(found, "namespace "+s)
		}
	}
	for _, s := range links {
		if strings.HasPrefix(s, ifp) {
			found = append(found, "link "+s)
		}
	}
	return found
}

func TestCleanup(t *testing.T) {
	var ip, nsp, ifp string
	exited := make(chan error, 1)
	t.Run("net", func(t *testing.T) {
		nt := New(t, 2)
		nt.AddHost(t)
		ip = nt.ip
		nsp = nsPrefix + strconv.Itoa(nt.pid) + "-" + nt.seq + "-"
		ifp = ifPrefix + strconv.Itoa(nt.pid) + "_" + nt.seq
		if got := ownedNames(t, ip, nsp, ifp); len(got) != 3+3+1 {
			t.Fatalf("the net of 3 hosts has %v, want 3 namespaces and 4 links", got)
		}
		// A process left running in a host, and a restore still pending.
		cmd := nt.Host(0).Command(context.Background(), "sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { exited <- cmd.Wait() }()
		if err := nt.Host(1).CutFor(time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	if got := ownedNames(t, ip, nsp, ifp); len(got) != 0 {
		t.Fatalf("left behind after cleanup: %v", got)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the process left running in a host outlived the cleanup")
	}
	// With no net left (this package's tests do not run in parallel), the
	// process's record is gone too.
	if _, err := os.Stat(filepath.Join(stateDir(), strconv.Itoa(os.Getpid()))); !os.IsNotExist(err) {
		t.Errorf("the process's record outlived its last net: %v", err)
	}
}

func TestCommandKillsGroup(t *testing.T) {
	nt := New(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	// The shell starts a grandchild and prints its pid; ending ctx must
	// kill both.
	cmd := nt.Host(0).Command(ctx, "sh", "-c", "sleep 60 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after ctx ended")
	}
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(grandchild, 0) == nil {
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(grandchild) + "/stat"); strings.Contains(string(st), ") Z ") {
			break // a zombie, waiting for its reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("the grandchild %d outlived its group's kill", grandchild)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSweepDeadProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("netns: skipped, making namespaces needs root")
	}
	ip, err := lookTool("ip")
	if err != nil {
		t.Skip("netns: skipped, no ip tool")
	}
	// A pid whose process has exited; the record's start time cannot match
	// whatever runs under that pid later.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	if err := os.MkdirAll(stateDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(stateDir(), strconv.Itoa(pid))
	if err := os.WriteFile(record, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns, br := nsName(pid, "0", 0), bridgeName(pid, "0")
	t.Cleanup(func() {
		run(ip, "netns", "del", ns)
		run(ip, "link", "del", br)
		os.Remove(record)
	})
	if out, err := run(ip, "netns", "add", ns); err != nil {
		unavailable(t, out)
	}
	if out, err := run(ip, "link", "add", br, "type", "bridge"); err != nil {
		t.Fatal(out)
	}
	nsp, ifp := nsPrefix+strconv.Itoa(pid)+"-", ifPrefix+strconv.Itoa(pid)+"_"
	if got := ownedNames(t, ip, nsp, ifp); len(got) != 2 {
		t.Fatalf("the dead process's leftovers: %v", got)
	}

	New(t, 0)
	if got := ownedNames(t, ip, nsp, ifp); len(got) != 0 {
		t.Fatalf("New left a dead process's leftovers: %v", got)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Fatalf("the dead process's record is still there: %v", err)
	}
	// The running process's own record stays.
	if _, err := os.Stat(filepath.Join(stateDir(), strconv.Itoa(os.Getpid()))); err != nil {
		t.Fatalf("this process's record: %v", err)
	}
}

// skipEnv makes TestHelperNetnsNew call New, for TestNewWithoutRoot.
const skipEnv = "TANDEM_NETNS_TEST_NEW"

func TestHelperNetnsNew(t *testing.T) {
	if os.Getenv(skipEnv) == "" {
		return
	}
	New(t, 1)
	t.Log("New made a net")
}

func TestNewWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("netns: skipped, running a child as another user needs root")
	}
	// The test binary, where an unprivileged user can run it.
	dir, err := os.MkdirTemp("", "netns-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "netns.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ci := range []string{"", "true"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperNetnsNew$", "-test.count=1", "-test.v")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), skipEnv+"=1", "CI="+ci)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		cancel()
		s := string(out)
		if ci == "" {
			if err != nil || !strings.Contains(s, "--- SKIP") || !strings.Contains(s, "not running as root") {
				t.Errorf("New as an unprivileged user: %v, want a skip that says it is not root:\n%s", err, s)
			}
		} else {
			if err == nil || !strings.Contains(s, "--- FAIL") || !strings.Contains(s, "CI=true") {
				t.Errorf("New as an unprivileged user under CI=true: %v, want a failure:\n%s", err, s)
			}
		}
	}
}

// TestAddHostKeepsBridgeAddress: a bridge takes the lowest hardware address
// of its ports unless its own was set, and a host that joins later must not
// change it: the running hosts' neighbour tables hold it, and their frames
// to the root namespace, sent to a port's address that is no longer the
// bridge's, would be dropped until those entries expire.
func TestAddHostKeepsBridgeAddress(t *testing.T) {
	nt := New(t, 2)
	show := func() (mac, assign string) {
		out, err := run(nt.ip, "-o", "link", "show", nt.bridge)
		if err != nil {
			t.Fatalf("ip link show %s: %v: %s", nt.bridge, err, out)
		}
		_, after, _ := strings.Cut(out, "link/ether ")
		b, err := os.ReadFile(filepath.Join("/sys/class/net", nt.bridge, "addr_assign_type"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(after + " ")[0], strings.TrimSpace(string(b))
	}
	before, assign := show()
	// 3: NET_ADDR_SET, an address the bridge keeps.
	if assign != "3" {
		t.Errorf("the bridge's address %s was not set (addr_assign_type %s)", before, assign)
	}
	for i := range 6 {
		nt.AddHost(t)
		if now, _ := show(); now != before {
			t.Fatalf("host %d joined: the bridge's address changed from %s to %s", i+2, before, now)
		}
	}
}
