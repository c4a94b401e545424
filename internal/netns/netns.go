package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// ErrNoNetem is wrapped by the error of Host.Netem when the kernel has no
// netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM). A test of delay or loss
// should check NetemAvailable first and skip, naming the missing qdisc.
var ErrNoNetem = errors.New("no netem qdisc in this kernel (sch_netem)")

const (
	// cmdTimeout bounds one run of ip or tc.
	cmdTimeout = 15 * time.Second
	// lockWait bounds how long New waits for another test process's setup.
	lockWait = 60 * time.Second
	// maxHosts is how many hosts fit in a /24 beside the root's address.
	maxHosts = 253
	// ifNameMax is the kernel's limit on an interface name (IFNAMSIZ-1).
	ifNameMax = 15
	// nsPrefix starts every namespace name the package makes.
	nsPrefix = "tandem-"
	// ifPrefix starts every interface name the package makes.
	ifPrefix = "tn"
)

// Net is a set of hosts (network namespaces) joined to one bridge in the
// root namespace. Its methods are safe for concurrent use.
type Net struct {
	t      testing.TB
	ip     string // path of the ip tool
	pid    int
	seq    string // this net's number among the process's nets, base 36
	bridge string
	subnet netip.Prefix
	root   netip.Addr

	mu     sync.Mutex
	hosts  []*Host
	closed bool
}

// New makes n hosts: namespaces joined by veth pairs to one bridge in the
// root namespace, which gets an address on the bridge too (RootAddr).
//
// It skips the test, saying why, where namespaces cannot be made (not root,
// no `ip` tool, namespace creation refused); when the environment has
// CI=true it fails the test instead. Any other failure fails the test.
// Everything it makes is removed by a t.Cleanup, which also kills processes
// still running in the hosts. Before making anything it removes what test
// processes that have died left behind.
func New(t testing.TB, n int) *Net {
	t.Helper()
	if n < 0 || n > maxHosts {
		t.Fatalf("netns: New: %d hosts asked for, want 0 to %d", n, maxHosts)
	}
	if os.Geteuid() != 0 {
		unavailable(t, "not running as root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)")
	}
	ipPath, err := lookTool("ip")
	if err != nil {
		unavailable(t, "the `ip` tool (iproute2) is not installed: "+err.Error())
	}
	nt := &Net{t: t, ip: ipPath, pid: os.Getpid()}

	unlock, err := lockState()
	if err != nil {
		t.Fatalf("netns: New: %v", err)
	}
	err = nt.setup()
	unlock()
	if err != nil {
		if errors.Is(err, errRefused) {
			unavailable(t, err.Error())
		}
		t.Fatalf("netns: New: %v", err)
	}
	t.Cleanup(nt.cleanup)
	for i := 0; i < n; i++ {
		nt.AddHost(t)
	}
	return nt
}

// errRefused marks a failure to make a namespace at all, which New turns
// into a skip.
var errRefused = errors.New("the kernel refused to make a network namespace")

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("netns: network namespaces cannot be made here, and CI=true requires them: %s", why)
	}
	t.Skipf("netns: skipped, network namespaces cannot be made here: %s", why)
}

// lookTool finds ip or tc on PATH or in the sbin directories, which a
// non-login PATH may lack.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in /usr/sbin, /sbin", name)
}

// setup runs under the state lock: it sweeps dead processes' leftovers,
// records this process, picks a free net number and subnet, and makes the
// bridge.
func (nt *Net) setup() error {
	if err := writeRecord(nt.pid); err != nil {
		return err
	}
	sweep(nt.ip, nt.pid)

	nsNames, err := listNamespaces(nt.ip)
	if err != nil {
		return err
	}
	links, err := listLinks(nt.ip)
	if err != nil {
		return err
	}
	taken := map[string]bool{}
	for _, s := range append(nsNames, links...) {
		taken[s] = true
	}
	for k := 0; ; k++ {
		seq := strconv.FormatInt(int64(k), 36)
		if len(bridgeName(nt.pid, seq)) > ifNameMax || len(vethName(nt.pid, seq, maxHosts)) > ifNameMax {
			return fmt.Errorf("no free net number left for pid %d (interface names would pass %d characters)", nt.pid, ifNameMax)
		}
		if !taken[bridgeName(nt.pid, seq)] && !taken[nsName(nt.pid, seq, 0)] {
			nt.seq = seq
			break
		}
	}
	nt.bridge = bridgeName(nt.pid, nt.seq)

	used, err := usedPrefixes(nt.ip)
	if err != nil {
		return err
	}
	nt.subnet, err = pickSubnet(nt.pid, nt.seq, used)
	if err != nil {
		return err
	}
	nt.root = nt.subnet.Addr().Next()

	// Probe: can this process make a namespace at all?
	probe := nsPrefix + strconv.Itoa(nt.pid) + "-" + nt.seq + "-probe"
	if out, err := run(nt.ip, "netns", "add", probe); err != nil {
		return fmt.Errorf("%w: ip netns add: %s", errRefused, out)
	}
	if out, err := run(nt.ip, "netns", "del", probe); err != nil {
		return fmt.Errorf("ip netns del %s: %s", probe, out)
	}

	// A bridge whose hardware address was not set takes the lowest of its
	// ports' addresses, so a host added later (AddHost) could change it
	// under the neighbour tables of the hosts already running: their frames
	// to the root namespace would then be dropped until those entries
	// expire (tens of seconds). A set address stays.
	mac, err := localMAC()
	if err != nil {
		return err
	}
	steps := [][]string{
		{"link", "add", nt.bridge, "address", mac, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"addr", "add", nt.root.String() + "/" + strconv.Itoa(nt.subnet.Bits()), "dev", nt.bridge},
		{"link", "set", nt.bridge, "up"},
	}
	for _, s := range steps {
		if out, err := run(nt.ip, s...); err != nil {
			run(nt.ip, "link", "del", nt.bridge)
			return fmt.Errorf("ip %s: %s", strings.Join(s, " "), out)
		}
	}
	return nil
}

// localMAC returns a random locally administered unicast hardware address.
func localMAC() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("a hardware address for the bridge: %w", err)
	}
	b[0] = b[0]&^0x01 | 0x02
	return net.HardwareAddr(b[:]).String(), nil
}

// Hosts returns the hosts, in the order they were made.
func (nt *Net) Hosts() []*Host {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	return append([]*Host(nil), nt.hosts...)
}

// Host returns host i (0-based, in the order the hosts were made). It panics
// if there is no host i.
func (nt *Net) Host(i int) *Host {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if i < 0 || i >= len(nt.hosts) {
		panic(fmt.Sprintf("netns: Host(%d): the net has %d hosts", i, len(nt.hosts)))
	}
	return nt.hosts[i]
}

// RootAddr returns the root namespace's IPv4 address on the bridge, such as
// "10.77.3.1"; every host can reach a server listening there.
func (nt *Net) RootAddr() string { return nt.root.String() }

// Subnet returns the net's IPv4 subnet, such as "10.77.3.0/24".
func (nt *Net) Subnet() string { return nt.subnet.String() }

// AddHost makes one more host and joins it to the bridge, as a node that
// joins a running job. Its failure fails t. The host is removed with the
// rest of the net.
func (nt *Net) AddHost(t testing.TB) *Host {
	t.Helper()
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if nt.closed {
		t.Fatalf("netns: AddHost: the net is already cleaned up")
	}
	i := len(nt.hosts)
	if i >= maxHosts {
		t.Fatalf("netns: AddHost: the net already has %d hosts, the most a /24 holds", i)
	}
	addr := nt.root
	for k := 0; k <= i; k++ {
		addr = addr.Next()
	}
	h := &Host{
		net:  nt,
		name: nsName(nt.pid, nt.seq, i),
		veth: vethName(nt.pid, nt.seq, i),
		addr: addr,
	}
	if err := h.create(); err != nil {
		h.destroy()
		t.Fatalf("netns: AddHost: host %d: %v", i, err)
	}
	nt.hosts = append(nt.hosts, h)
	return h
}

// cleanup removes everything the net made; it runs as a t.Cleanup.
func (nt *Net) cleanup() {
	nt.mu.Lock()
	nt.closed = true
	hosts := append([]*Host(nil), nt.hosts...)
	nt.mu.Unlock()
	for _, h := range hosts {
		h.mu.Lock()
		h.closed = true
		if h.restore != nil {
			h.restore.Stop()
			h.restore = nil
		}
		h.mu.Unlock()
	}
	for _, h := range hosts {
		if err := h.destroy(); err != nil {
			nt.t.Errorf("netns: cleanup: host %s: %v", h.name, err)
		}
	}
	if out, err := run(nt.ip, "link", "del", nt.bridge); err != nil && linkExists(nt.ip, nt.bridge) {
		nt.t.Errorf("netns: cleanup: ip link del %s: %s", nt.bridge, out)
	}
	// The process's record goes once none of its nets is left.
	if unlock, err := lockState(); err == nil {
		if nss, links, err := owned(nt.ip, nt.pid); err == nil && len(nss)+len(links) == 0 {
			removeRecord(nt.pid)
		}
		unlock()
	}
}

// nsName, bridgeName and vethName name what net seq of process pid makes.
func nsName(pid int, seq string, i int) string {
	return fmt.Sprintf("%s%d-%s-h%d", nsPrefix, pid, seq, i)
}

func bridgeName(pid int, seq string) string {
	return fmt.Sprintf("%s%d_%sb", ifPrefix, pid, seq)
}

func vethName(pid int, seq string, i int) string {
	return fmt.Sprintf("%s%d_%sv%s", ifPrefix, pid, seq, strconv.FormatInt(int64(i), 36))
}

// run runs tool with args, bounded by cmdTimeout, and returns its output
// (trimmed) with its error.
func run(tool string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return strings.TrimSpace(out.String()), fmt.Errorf("%s %s: %w after %v", filepath.Base(tool), strings.Join(args, " "), errs.Timeout, cmdTimeout)
	}
	if err != nil {
		msg := strings.TrimSpace(out.String())
		if msg == "" {
			msg = err.Error()
		}
		return msg, fmt.Errorf("%s %s: %s", filepath.Base(tool), strings.Join(args, " "), msg)
	}
	return strings.TrimSpace(out.String()), nil
}

// listNamespaces returns the names of the named network namespaces.
func listNamespaces(ip string) ([]string, error) {
	out, err := run(ip, "netns", "list")
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %s", out)
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// listLinks returns the names of the root namespace's interfaces.
func listLinks(ip string) ([]string, error) {
	out, err := run(ip, "-o", "link", "show")
	if err != nil {
		return nil, fmt.Errorf("ip link show: %s", out)
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		// "7: name@peer: <FLAGS> ..."
		f := strings.SplitN(line, ": ", 3)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(f[1], "@")
		names = append(names, name)
	}
	return names, nil
}

func linkExists(ip, name string) bool {
	_, err := run(ip, "link", "show", "dev", name)
	return err == nil
}

// usedPrefixes returns every IPv4 prefix the root namespace has an address
// or a route in (any table), except default routes.
func usedPrefixes(ip string) ([]netip.Prefix, error) {
	var used []netip.Prefix
	out, err := run(ip, "-4", "-o", "addr", "show")
	if err != nil {
		return nil, fmt.Errorf("ip addr show: %s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil {
					used = append(used, p.Masked())
				}
			}
		}
	}
	out, err = run(ip, "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, fmt.Errorf("ip route show table all: %s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		switch dst {
		case "unicast", "local", "broadcast", "multicast", "anycast", "unreachable",
			"blackhole", "prohibit", "throw", "nat":
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil && p.Bits() > 0 {
			used = append(used, p.Masked())
		}
	}
	return used, nil
}

// pickSubnet picks a /24 for net seq of process pid that overlaps none of
// used: first in 10.64.0.0-10.191.255.0, then in 172.16.0.0/12, then in
// 192.168.0.0/16, each time at places derived from the pid.
func pickSubnet(pid int, seq string, used []netip.Prefix) (netip.Prefix, error) {
	for attempt := 0; attempt < 512; attempt++ {
		h := fnv.New32a()
		fmt.Fprintf(h, "%d/%s/%d", pid, seq, attempt)
		v := h.Sum32()
		var a [4]byte
		switch {
		case attempt < 256:
			a = [4]byte{10, byte(64 + v%128), byte(v >> 8), 0}
		case attempt < 448:
			a = [4]byte{172, byte(16 + v%16), byte(v >> 8), 0}
		default:
			a = [4]byte{192, 168, byte(v >> 8), 0}
		}
		p := netip.PrefixFrom(netip.AddrFrom4(a), 24)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free /24 found in 10.64-191.x, 172.16/12 or 192.168/16: the machine's addresses and routes cover them all")
}
