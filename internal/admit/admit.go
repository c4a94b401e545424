// Package admit bounds what a server spends on connections it has not yet
// authenticated, and keeps its warnings about them from flooding a log.
//
// Every Tandem server (the store, the RPC agent, a process group's mesh
// listener) accepts connections before it knows who is on the other end. A
// Gate caps how many such connections may be in their handshake at once, in
// all and from one remote host; a connection over either cap is closed at
// once, before anything is allocated for it. Together with a short handshake
// deadline and a small first read buffer this keeps a flood of idle or junk
// connections from growing the server's memory: the cost of the flood is
// bounded by the caps, not by the number of connections.
//
// A Warner logs a repeated warning at most once per interval and says how
// many it left out, so that thousands of refused connections write a few
// lines, not thousands.
package admit

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// Defaults shared by Tandem's servers.
const (
	// MaxPending is the number of connections a server lets be in their
	// handshake at once.
	MaxPending = 256
	// MaxPendingPerHost is the number of connections one remote host may
	// have in their handshake at once.
	MaxPendingPerHost = 64
	// HandshakeTimeout is how long an unauthenticated connection may take to
	// finish its handshake.
	HandshakeTimeout = 5 * time.Second
	// HelloBuffer is the read buffer for a connection until it has
	// authenticated; the full buffer is allocated only afterwards.
	HelloBuffer = 512
	// WarnEvery is how often a Warner writes one kind of warning.
	WarnEvery = 10 * time.Second
)

// Gate counts the connections in their handshake. The zero Gate is not
// usable; make one with NewGate. It is safe for concurrent use.
type Gate struct {
	max, perHost int

	mu      sync.Mutex
	pending int
	byHost  map[string]int
	refused uint64
}

// NewGate returns a gate that admits at most max connections in their
// handshake at once, and at most perHost from one remote host. A limit of
// zero or less means the default.
func NewGate(max, perHost int) *Gate {
	if max <= 0 {
		max = MaxPending
	}
	if perHost <= 0 {
		perHost = MaxPendingPerHost
	}
	return &Gate{max: max, perHost: perHost, byHost: map[string]int{}}
}

// Admit reserves a handshake slot for a connection from remote. When ok is
// false the caller must close the connection at once; otherwise it must call
// done exactly once when the handshake has ended, whether the peer was
// accepted or refused. done may be called more than once; later calls do
// nothing.
func (g *Gate) Admit(remote net.Addr) (done func(), ok bool) {
	host := hostOf(remote)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending >= g.max || g.byHost[host] >= g.perHost {
		g.refused++
		return nil, false
	}
	g.pending++
	g.byHost[host]++
	var once sync.Once
	return func() { once.Do(func() { g.release(host) }) }, true
}

func (g *Gate) release(host string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending--
	if g.byHost[host]--; g.byHost[host] <= 0 {
		delete(g.byHost, host)
	}
}

// Pending returns the number of connections in their handshake now.
func (g *Gate) Pending() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending
}

// Refused returns the number of connections the gate has turned away.
func (g *Gate) Refused() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused
}

// hostOf is the remote host of an address, without its port.
func hostOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	s := a.String()
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

// Warner writes a warning at most once per interval; the next one it writes
// after leaving some out carries their number as "suppressed". It is safe
// for concurrent use.
type Warner struct {
	log   *slog.Logger
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// NewWarner returns a Warner writing to log (slog.Default() when nil) at
// most once per every (WarnEvery when zero or less).
func NewWarner(log *slog.Logger, every time.Duration) *Warner {
	if log == nil {
		log = slog.Default()
	}
	if every <= 0 {
		every = WarnEvery
	}
	return &Warner{log: log, every: every}
}

// Warn logs msg with args, unless a warning was written less than the
// interval ago, in which case it only counts it.
func (w *Warner) Warn(msg string, args ...any) {
	w.mu.Lock()
	now := time.Now()
	if !w.last.IsZero() && now.Sub(w.last) < w.every {
		w.suppressed++
		w.mu.Unlock()
		return
	}
	n := w.suppressed
	w.suppressed = 0
	w.last = now
	w.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n, "suppressed_over", w.every.String())
	}
	w.log.Warn(msg, args...)
}
