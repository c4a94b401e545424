// Package floodtest holds what the connection-flood tests of Tandem's servers
// share: opening thousands of idle TCP connections to a server, raising the
// open-file limit they need, and reading a process's resident memory from
// /proc. It is for tests only, and works on Linux (elsewhere RSS fails).
//
// A test starts the server in a child process (internal/childtest; the
// child serves ServeFreeOSMemory), reads its baseline RSS, opens a flood from
// a loopback address other than 127.0.0.1 (so that clients on 127.0.0.1
// count as another host to the server's per-host cap), checks that
// legitimate clients are still served, closes the flood and reads the RSS
// again:
//
//	child := childtest.Start(t, "the server", "TestHelperServer", env+"=1")
//	addr := child.Line(t, "ADDR")
//	base, baseHeld, _ := floodtest.RSSAfterFree(child.Pid, child.Out)
//	f := floodtest.Open(ctx, addr, 6000, floodtest.FloodHost)
//	// ... legitimate clients ...
//	peak, _ := floodtest.PeakRSS(child.Pid)
//	f.Close()
//	after, afterHeld, _ := floodtest.RSSAfterFree(child.Pid, child.Out)
//	floodtest.Memory{Base: base, Peak: peak, After: after, BaseHeld: baseHeld, AfterHeld: afterHeld}.Check(t, "the server")
package floodtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FloodHost is the loopback address floods come from; legitimate clients use
// 127.0.0.1.
const FloodHost = "127.0.0.2"

// ConnsEnv names an environment variable that overrides the number of
// connections a flood test opens (for measuring by hand with 15000, say).
const ConnsEnv = "TANDEM_FLOOD_CONNS"

// Conns returns the number of connections a flood test should open: def, or
// the value of ConnsEnv when it is a positive number.
func Conns(def int) int {
	if n, err := strconv.Atoi(os.Getenv(ConnsEnv)); err == nil && n > 0 {
		return n
	}
	return def
}

// RaiseFileLimit raises this process's soft limit on open files to at least
// want (as far as the hard limit allows) and returns the soft limit now in
// force. Child processes inherit it.
func RaiseFileLimit(want int) (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("floodtest: reading RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < uint64(want) && lim.Cur < lim.Max {
		lim.Cur = min(uint64(want), lim.Max)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("floodtest: raising RLIMIT_NOFILE to %d: %w", lim.Cur, err)
		}
	}
	return int(lim.Cur), nil
}

// RSS returns the resident memory of process pid in bytes.
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS:") }

// PeakRSS returns the largest resident memory process pid has had, in bytes.
func PeakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM:") }

func statusBytes(pid int, field string) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("floodtest: reading process %d's memory: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("floodtest: process %d: bad %s line %q", pid, field, sc.Text())
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("floodtest: process %d's status has no %s line", pid, field)
}

// Freed starts the line a child prints on stdout when it has returned its
// free memory to the operating system; see ServeFreeOSMemory.
const Freed = "FREED"

// ServeFreeOSMemory makes this process, on each SIGUSR1, collect garbage and
// return the memory it no longer uses to the operating system
// (debug.FreeOSMemory), then print Freed and the bytes the Go runtime still
// holds for live objects and goroutine stacks on stdout. It is a measuring
// aid for a child under test: the runtime gives freed memory back lazily, so
// the RSS read after a flood says what the server still holds only once this
// has run. It returns a function that stops it.
func ServeFreeOSMemory() (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				debug.FreeOSMemory()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				fmt.Println(Freed, ms.HeapInuse+ms.StackInuse)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}
}

// RSSAfterFree asks the child pid (running ServeFreeOSMemory) to return its
// free memory, waits for its Freed line on stdout, and returns its RSS and
// the bytes its Go runtime holds for live objects and stacks.
func RSSAfterFree(pid int, stdout *bufio.Reader) (rss, held int64, err error) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return 0, 0, err
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		return 0, 0, fmt.Errorf("floodtest: signalling process %d: %w", pid, err)
	}
	for {
		line, err := stdout.ReadString('\n')
		if err != nil {
			return 0, 0, fmt.Errorf("floodtest: process %d did not say it freed its memory: %w", pid, err)
		}
		if rest, ok := strings.CutPrefix(line, Freed+" "); ok {
			held, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("floodtest: process %d: bad line %q", pid, line)
			}
			rss, err := RSS(pid)
			return rss, held, err
		}
	}
}

// Bounds of the flood tests: how much a server's RSS may grow while
// thousands of idle connections hit it (without the caps and small hello
// buffers, a few thousand connections grow it by hundreds of MiB), how far
// above its baseline it may stay once they are gone and it has returned its
// free memory, and how much more the Go runtime may then hold for live
// objects and stacks than before the flood (what a leak would show in).
const (
	PeakGrowth = 64 << 20
	HeldGrowth = 4 << 20
)

// AfterGrowth is the RSS bound after a flood: 16 MiB, 48 MiB under the race
// detector, whose runtime keeps memory of its own.
func AfterGrowth() int64 {
	if Race {
		return 48 << 20
	}
	return 16 << 20
}

// MiB converts bytes to mebibytes for messages.
func MiB(b int64) float64 { return float64(b) / (1 << 20) }

// Flood is a set of idle connections to one server.
type Flood struct {
	// Opened is how many connections were established and still open when
	// the dial returned; Reset how many the server had already reset by then
	// (a server over its cap does that); Failed how many attempts failed
	// otherwise (the server's accept queue overflowing, say).
	Opened, Reset, Failed int
	// Took is how long opening them took.
	Took time.Duration
	// Err is the first error of a failed attempt.
	Err error

	conns []net.Conn
}

// Open opens n TCP connections to addr from the local address from (an IP
// of this machine) and keeps them open without sending anything, until
// Close. It opens them from several goroutines at once and returns when every
// attempt has ended (each is bounded by a few seconds) or ctx ends.
func Open(ctx context.Context, addr string, n int, from string) *Flood {
	const workers = 32
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Control: bindNoPort}
	f := &Flood{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan struct{})
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range next {
				c, err := d.DialContext(ctx, "tcp", addr)
				mu.Lock()
				switch {
				case errors.Is(err, syscall.ECONNRESET):
					f.Reset++
				case err != nil:
					f.Failed++
					if f.Err == nil {
						f.Err = err
					}
				default:
					f.Opened++
					f.conns = append(f.conns, c)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for range n {
		select {
		case next <- struct{}{}:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	f.Took = time.Since(start)
	return f
}

// Each calls fn on every connection of the flood still open.
func (f *Flood) Each(fn func(net.Conn)) {
	for _, c := range f.conns {
		fn(c)
	}
}

// Reached is how many connections reached the server: those still open and
// those it had reset.
func (f *Flood) Reached() int { return f.Opened + f.Reset }

// Close closes every connection of the flood, with a reset, so that no
// socket stays in TIME_WAIT holding a local port that a later flood from the
// same address needs.
func (f *Flood) Close() {
	for _, c := range f.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	f.conns = nil
}

// CountLines returns how many lines of s contain sub.
func CountLines(s, sub string) int {
	n := 0
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}
