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

// nextPoll is how long a pollReader whose poll starts at base and lasted
// window polls after a read that waited for bytes (see pollReader): twice
// the wait, or the last window less a sixty-fourth, whichever is longer,
// within [base, pollCeiling]; base after a wait longer than the ceiling.
//
// The window shrinks slowly because a connection's waits alternate: in a
// 4 MiB echo most reads wait 15 to 60 µs (the frames that follow a pushed
// tensor) and some 100 to 350 µs (the peer copying its half, then making
// the reply). With a window of twice the last wait, 845 of the 7,347 waits
// of a 1000-call echo (both processes) parked, most just past a short
// wait's window, and a parked read costs a wake-up of an idle virtual CPU;
// with the slow shrink 79 of 6,521 did, most of them waits of milliseconds.
// tandem bench rpc, four alternating runs (2-core AMD Zen 5, 2026-12-02):
// 4 B echo p50 24-44 µs against 42-63, 1 MiB 249-295 µs against 285-391,
// 4 MiB echo_reuse p99 0.68-2.7 ms (median 0.73) against 1.1-3.3 (1.8); the
// plain 4 MiB echo's p99, which its collections rule, alike.
func nextPoll(waited, window, base time.Duration) time.Duration {
	if waited > pollCeiling {
		return base
	}
	return min(max(2*waited, window-window/64, base), pollCeiling)
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
