package rpc

import (
	"io"
	"net"
	"time"
)

// DefaultPoll is how long a connection to a worker on the same host looks
// for the next frame before its read loop parks (see WithPoll).
const DefaultPoll = 50 * time.Microsecond

// pollCeiling bounds how long a pollReader's poll grows (see pollReader,
// poll_unix.go). A process whose goroutines all park goes idle, and the
// next frame costs a wake-up of its thread, often of an idle virtual CPU,
// and a Go runtime that restarts its monitor's 20 µs ticks for the next
// millisecond; a poll keeps the process running through the wait. Measured with tandem
// bench rpc (two processes of one GOMAXPROCS each on two cores,
// 2026-12-02, three alternating runs), echo p50 polling up to 2 ms against
// 50 µs: 4 MiB 768-826 µs against 1.04-1.21 ms, 1 MiB 303-365 µs against
// 487-608; 4 B and 4 KiB alike within the runs' spread.
const pollCeiling = 2 * time.Millisecond

// nextPoll is how long a pollReader whose poll starts at base polls after
// a read that waited for bytes (see pollReader): twice the wait, within
// [base, pollCeiling], or base after a wait longer than the ceiling.
func nextPoll(waited, base time.Duration) time.Duration {
	if waited > pollCeiling {
		return base
	}
	return min(max(2*waited, base), pollCeiling)
}

// onOneHost reports whether a plain TCP connection joins two processes of
// one host: the peer proved it (peerPID, see cma.go), the peer is on a
// loopback address, or both ends have the same address.
func onOneHost(nc net.Conn, peerPID int) bool {
	if peerPID != 0 {
		return true
	}
	l, lok := nc.LocalAddr().(*net.TCPAddr)
	r, rok := nc.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return false
	}
	return r.IP.IsLoopback() || l.IP.Equal(r.IP)
}

// pollFor starts the connection's polling (see pollReader) when the peer is
// on this host; elsewhere a round trip takes longer than a poll would last.
func (c *conn) pollFor(pr *pollReader) {
	c.poll = pr
	if pr == nil || c.a.opts.poll <= 0 || !onOneHost(c.nc, c.peerPID) {
		return
	}
	pr.spin.Store(int64(c.a.opts.poll))
}

// readerOf is what a connection's frames are read from: the pollReader
// where there is one.
func readerOf(nc net.Conn, pr *pollReader) io.Reader {
	if pr == nil {
		return nc
	}
	return pr
}
