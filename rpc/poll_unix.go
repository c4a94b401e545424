//go:build unix

package rpc

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/futex"
	"github.com/tandemml/tandem/internal/recvbuf"
)

// pollReader reads a TCP socket, and when no bytes are there it looks again
// for a while (spin), yielding between looks to the process's other
// goroutines and to the other threads on its CPU (futex.Yield: the peer
// that is to write the bytes may be one), before it parks on the runtime's
// network poller. A parked read costs a wake-up when bytes come (the poller's
// thread, then the reader's: tens of microseconds each on virtual
// machines), which is most of a small call's round trip between two
// processes of one host; the peer's answer usually comes sooner than that.
//
// The poll lasts spin at first and adapts to the connection: a wait that
// ended within pollCeiling has the next poll last twice as long as that
// wait, or a sixty-fourth less than the last poll where that is longer
// (at least spin, at most pollCeiling; nextPoll), and a longer wait brings
// it back to spin. The reply to a large call, which comes once the peer
// has copied the argument and made the reply, is then caught polling
// rather than parked.
//
// While a garbage collection marks, a read that finds no bytes parks at
// once: with one processor a process the poll would leave the collector a
// quarter of it (its fractional worker) and spread the marking over
// several calls, where a parked reader leaves it the whole processor
// during the wait (its idle worker, which yields as soon as the network
// poller has the frame, so the process does not go idle either). tandem
// bench rpc -min 4M -max 4M -iters 1000, four alternating runs (2-core AMD
// Zen 5, 2026-12-02): the plain echo's p99 1.18-1.57 ms (median 1.41)
// against 1.52-2.17 (1.57), p50 alike; echo_reuse, which collects nothing,
// alike.
type pollReader struct {
	nc     net.Conn
	rc     syscall.RawConn
	spin   atomic.Int64  // nanoseconds; 0: park at once
	window time.Duration // the next poll's length; the read loop's alone
}

// newPollReader returns a pollReader on nc, or nil when nc has no file
// descriptor to read (a TLS connection: its records are read whole).
func newPollReader(nc net.Conn) *pollReader {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &pollReader{nc: nc, rc: rc}
}

func (r *pollReader) Read(p []byte) (int, error) {
	base := time.Duration(r.spin.Load())
	if base <= 0 || len(p) == 0 {
		return r.nc.Read(p)
	}
	spin := max(base, r.window)
	var (
		n     int
		errno error
		start time.Time
	)
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, errno = syscall.Read(int(fd), p)
			switch {
			case errno == syscall.EINTR:
				continue
			case errno != syscall.EAGAIN:
				return true
			case start.IsZero():
				start = time.Now()
				if recvbuf.Marking() {
					return false
				}
			case time.Since(start) >= spin:
				return false // park until the poller says the socket is readable
			}
			futex.Yield()
		}
	})
	if !start.IsZero() {
		r.window = nextPoll(time.Since(start), spin, base)
	}
	switch {
	case err != nil:
		return 0, err
	case errno != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: r.nc.LocalAddr(), Addr: r.nc.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
