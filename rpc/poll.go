package rpc

import (
	"io"
	"net"
	"time"
)

// DefaultPoll is how long a connection to a worker on the same host looks
// for the next frame before its read loop parks (see WithPoll).
const DefaultPoll = 50 * time.Microsecond

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
