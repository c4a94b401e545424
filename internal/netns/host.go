package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// innerLink is the name of a host's end of its veth pair, inside its
// namespace.
const innerLink = "eth0"

// commandWaitDelay bounds how long Wait on a Host.Command waits for the
// command's output pipes to close once the command has exited or been
// killed.
const commandWaitDelay = 5 * time.Second

// Host is one network namespace on the net: a "machine" with one link (a
// veth pair) to the bridge. Its methods are safe for concurrent use.
type Host struct {
	net  *Net
	name string // namespace
	veth string // root-namespace end of the veth pair
	addr netip.Addr

	mu      sync.Mutex
	closed  bool
	gen     uint64      // counts link changes, so a stale CutFor restore does nothing
	restore *time.Timer // a pending CutFor restore
}

// Name returns the host's namespace name, for `ip netns exec` and the like.
func (h *Host) Name() string { return h.name }

// Addr returns the host's IPv4 address on the bridge.
func (h *Host) Addr() string { return h.addr.String() }

// create makes the namespace and its veth pair, and brings lo and the link
// up.
func (h *Host) create() error {
	ip := h.net.ip
	prefix := h.addr.String() + "/" + strconv.Itoa(h.net.subnet.Bits())
	steps := [][]string{
		{"netns", "add", h.name},
		{"link", "add", h.veth, "type", "veth", "peer", "name", innerLink, "netns", h.name},
		{"link", "set", h.veth, "master", h.net.bridge},
		{"link", "set", h.veth, "up"},
		{"-n", h.name, "link", "set", "lo", "up"},
		{"-n", h.name, "addr", "add", prefix, "dev", innerLink},
		{"-n", h.name, "link", "set", innerLink, "up"},
	}
	for _, s := range steps {
		if out, err := run(ip, s...); err != nil {
			return fmt.Errorf("ip %s: %s", strings.Join(s, " "), out)
		}
	}
	return nil
}

// destroy kills what runs in the host and removes its veth pair and
// namespace; what is already gone is not an error.
func (h *Host) destroy() error {
	ip := h.net.ip
	killIn(ip, h.name)
	var failed []string
	if out, err := run(ip, "link", "del", h.veth); err != nil && linkExists(ip, h.veth) {
		failed = append(failed, "ip link del "+h.veth+": "+out)
	}
	if out, err := run(ip, "netns", "del", h.name); err != nil {
		if names, lerr := listNamespaces(ip); lerr != nil || contains(names, h.name) {
			failed = append(failed, "ip netns del "+h.name+": "+out)
		}
	}
	if failed != nil {
		return errors.New(strings.Join(failed, "; "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Command returns a command that runs name with args inside the host's
// namespace (through `ip netns exec`, which execs name in place, so the
// Cmd's process is the command itself). The command runs in a process group
// of its own, and when ctx ends the whole group is killed with SIGKILL. To
// add process attributes, change the fields of cmd.SysProcAttr rather than
// replacing it. Wait gives up on the output pipes commandWaitDelay after the
// command is gone.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.net.ip, append([]string{"netns", "exec", h.name, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = commandWaitDelay
	return cmd
}

// LinkDown takes the host's link down at the bridge end, as a cable pulled
// at the switch: the host keeps its address, but what it sends and what is
// sent to it is lost until LinkUp. It cancels a pending CutFor restore.
func (h *Host) LinkDown() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.change("LinkDown"); err != nil {
		return err
	}
	return h.setLink("LinkDown", "down")
}

// LinkUp brings the host's link back up. It cancels a pending CutFor
// restore.
func (h *Host) LinkUp() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.change("LinkUp"); err != nil {
		return err
	}
	return h.setLink("LinkUp", "up")
}

// CutFor takes the host's link down now and brings it up again after d, in
// the background; it returns at once. A later LinkDown, LinkUp or CutFor
// cancels the pending restore, and so does the net's cleanup. A failure to
// restore the link fails the test that made the net.
func (h *Host) CutFor(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("netns: CutFor %s: %w: the duration %v is not positive", h.name, errs.InvalidArgument, d)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.change("CutFor"); err != nil {
		return err
	}
	if err := h.setLink("CutFor", "down"); err != nil {
		return err
	}
	gen := h.gen
	h.restore = time.AfterFunc(d, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.closed || h.gen != gen {
			return
		}
		h.restore = nil
		if err := h.setLink("CutFor", "up"); err != nil {
			// Under h.mu, so the net's cleanup (and the test) has not ended.
			h.net.t.Errorf("netns: CutFor %s: restoring the link after %v: %v", h.name, d, err)
		}
	})
	return nil
}

// change checks that the host is still there and cancels a pending restore;
// h.mu is held.
func (h *Host) change(op string) error {
	if h.closed {
		return fmt.Errorf("netns: %s %s: %w: the net is cleaned up", op, h.name, errs.Closed)
	}
	h.gen++
	if h.restore != nil {
		h.restore.Stop()
		h.restore = nil
	}
	return nil
}

func (h *Host) setLink(op, state string) error {
	if _, err := run(h.net.ip, "link", "set", h.veth, state); err != nil {
		return fmt.Errorf("netns: %s %s: %w", op, h.name, err)
	}
	return nil
}

// Netem delays every packet on the host's link by delay and drops each with
// probability lossPercent/100, in both directions (so a round trip gains
// twice delay), replacing any shaping set before. Where the kernel has no
// netem qdisc it returns an error wrapping ErrNoNetem and changes nothing.
func (h *Host) Netem(delay time.Duration, lossPercent float64) error {
	if delay < 0 || lossPercent < 0 || lossPercent > 100 || lossPercent != lossPercent {
		return fmt.Errorf("netns: Netem %s: %w: delay %v must not be negative and loss %v%% must be 0 to 100", h.name, errs.InvalidArgument, delay, lossPercent)
	}
	spec := []string{"netem",
		"delay", strconv.FormatInt(delay.Microseconds(), 10) + "us",
		"loss", strconv.FormatFloat(lossPercent, 'f', -1, 64) + "%",
		"limit", "10000"}
	err := h.setQdisc(spec)
	if err != nil && isUnknownQdisc(err) {
		return fmt.Errorf("netns: Netem %s: %w: %v", h.name, ErrNoNetem, err)
	}
	if err != nil {
		return fmt.Errorf("netns: Netem %s: %w", h.name, err)
	}
	return nil
}

// isUnknownQdisc tells tc's answers for a qdisc kind the kernel (or tc)
// does not have.
func isUnknownQdisc(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "kind is unknown") || strings.Contains(s, "unknown qdisc") ||
		strings.Contains(s, "no such file or directory") || strings.Contains(s, "not supported")
}

// RateLimit limits the host's link to bitsPerSec in each direction with a
// token bucket (tbf), replacing any shaping set before. The bucket holds
// 20 ms of traffic (at least 16 KiB), and a packet waits at most 200 ms for
// tokens before it is dropped.
func (h *Host) RateLimit(bitsPerSec int64) error {
	if bitsPerSec < 8000 {
		return fmt.Errorf("netns: RateLimit %s: %w: %d bit/s is below the least tbf shapes well (8000)", h.name, errs.InvalidArgument, bitsPerSec)
	}
	burst := max(bitsPerSec/8/50, 16<<10)
	spec := []string{"tbf",
		"rate", strconv.FormatInt(bitsPerSec, 10) + "bit",
		"burst", strconv.FormatInt(burst, 10),
		"latency", "200ms"}
	if err := h.setQdisc(spec); err != nil {
		return fmt.Errorf("netns: RateLimit %s: %w", h.name, err)
	}
	return nil
}

// ClearQdisc removes the shaping Netem or RateLimit set, in both
// directions; with none set it does nothing.
func (h *Host) ClearQdisc() error {
	tc, err := lookTool("tc")
	if err != nil {
		return fmt.Errorf("netns: ClearQdisc %s: %w", h.name, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("netns: ClearQdisc %s: %w: the net is cleaned up", h.name, errs.Closed)
	}
	var failed []string
	for _, dev := range h.qdiscDevs() {
		if out, err := run(tc, tcArgs(dev, "del", nil)...); err != nil && !noQdisc(out) {
			failed = append(failed, out)
		}
	}
	if failed != nil {
		return fmt.Errorf("netns: ClearQdisc %s: %s", h.name, strings.Join(failed, "; "))
	}
	return nil
}

// noQdisc tells tc's answers for deleting a root qdisc that was never set.
func noQdisc(out string) bool {
	s := strings.ToLower(out)
	return strings.Contains(s, "handle of zero") || strings.Contains(s, "no such file or directory") ||
		strings.Contains(s, "invalid handle")
}

// qdiscDevs returns the tc arguments that name the two ends of the host's
// link: the bridge end, whose egress is what the host receives, and the
// host's end, whose egress is what it sends.
func (h *Host) qdiscDevs() [][]string {
	return [][]string{
		{"dev", h.veth},
		{"-n", h.name, "dev", innerLink},
	}
}

// setQdisc installs spec as the root qdisc of both ends of the link; if the
// second end fails, the first is cleared again.
func (h *Host) setQdisc(spec []string) error {
	tc, err := lookTool("tc")
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("%w: the net is cleaned up", errs.Closed)
	}
	for i, dev := range h.qdiscDevs() {
		args := tcArgs(dev, "replace", spec)
		if _, err := run(tc, args...); err != nil {
			for _, done := range h.qdiscDevs()[:i] {
				run(tc, tcArgs(done, "del", nil)...)
			}
			return err
		}
	}
	return nil
}

// tcArgs builds `tc [-n ns] qdisc <verb> dev <dev> root <spec>`.
func tcArgs(dev []string, verb string, spec []string) []string {
	var args []string
	if dev[0] == "-n" {
		args = append(args, dev[0], dev[1])
		dev = dev[2:]
	}
	args = append(args, "qdisc", verb)
	args = append(args, dev...)
	args = append(args, "root")
	return append(args, spec...)
}

// NetemAvailable reports whether the kernel has the netem qdisc, by trying
// it on the loopback link of a throwaway namespace. It reports false where
// namespaces cannot be made (not root) or tc is missing.
func NetemAvailable() bool {
	if os.Geteuid() != 0 {
		return false
	}
	ip, err := lookTool("ip")
	if err != nil {
		return false
	}
	tc, err := lookTool("tc")
	if err != nil {
		return false
	}
	// Under the state lock, with this process recorded, so that a crash
	// leaves a namespace the next sweep removes.
	unlock, err := lockState()
	if err != nil {
		return false
	}
	defer unlock()
	pid := os.Getpid()
	if err := writeRecord(pid); err != nil {
		return false
	}
	name := nsPrefix + strconv.Itoa(pid) + "-netemprobe"
	if _, err := run(ip, "netns", "add", name); err != nil {
		return false
	}
	_, err = run(tc, "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
	run(ip, "netns", "del", name)
	if nss, links, lerr := owned(ip, pid); lerr == nil && len(nss)+len(links) == 0 {
		removeRecord(pid)
	}
	return err == nil
}
