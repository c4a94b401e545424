package tcp

import (
	"errors"
	"net"
	"os"
	"time"

	"github.com/tandemml/tandem/internal/liveness"
)

// Liveness: every connection proves its peer alive.
//
// A peer that stops (SIGSTOP, a debugger, swapping) or drops off the network
// closes nothing: its kernel, or nobody, answers, and a Recv from it would
// wait for the operation's whole deadline. So each connection has a watcher
// goroutine that
//
//   - sends a heartbeat frame (a bare header) when nothing else went out for
//     about an interval, never waiting for the line: a write in flight
//     already proves this rank alive, so the heartbeat is skipped then;
//   - fails the peer as unresponsive, with an error wrapping ErrPeerLost
//     that says since when it has been silent, once nothing at all (data,
//     acknowledgements, heartbeats) has come from it for the timeout.
//
// The reader stamps the time of every read from the socket, so a large
// payload that is still streaming in counts as a sign of life. Until the
// first byte arrives a peer gets setupGrace on top of the timeout, since
// it may still be setting up its other connections. A stopped
// process's kernel still acknowledges TCP segments, which is why only bytes
// sent by the process itself count. TCP_USER_TIMEOUT, set to the same
// timeout, additionally makes the kernel give up on data that the peer's
// machine never acknowledges (a cut link), so a writer blocked on a full
// socket fails too.

// setupGrace is the extra time a peer gets before its first byte. Ranks
// start their transports when their own set-up is done (every connection
// made and probed), so one rank may start hearing a peer that is still
// probing a third rank; no set-up step waits longer than a handshake.
const setupGrace = handshakeTimeout

// minHeartbeat bounds the heartbeat interval a peer may ask for.
const minHeartbeat = 10 * time.Millisecond

// liveConn is the reader's view of the connection: it stamps every read
// that returns data.
type liveConn struct {
	c *net.TCPConn
	p *peer
}

func (l liveConn) Read(b []byte) (int, error) {
	n, err := l.c.Read(b)
	if n > 0 {
		l.p.heard.Store(l.p.t.clock())
	}
	return n, err
}

// clock is the time since the transport was made, on the monotonic clock.
func (t *Transport) clock() int64 { return int64(time.Since(t.epoch)) }

// lastHeard is when the last byte from the peer was read.
func (p *peer) lastHeard() time.Time { return p.t.epoch.Add(time.Duration(p.heard.Load())) }

// heartbeatAsked is the reader's handling of a heartbeat frame whose length
// field asks for a heartbeat every ms milliseconds.
func (p *peer) heartbeatAsked(ms uint64) {
	if ms == 0 || p.asked.Load() != 0 {
		return
	}
	d := max(time.Duration(min(ms, uint64(time.Hour/time.Millisecond)))*time.Millisecond, minHeartbeat)
	p.asked.Store(int64(d))
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// watch is the connection's watcher goroutine (see above). It ticks twice
// per heartbeat interval and sends a heartbeat after two ticks without any
// frame going out, so that the peer hears from this rank at least every one
// and a half intervals, and an idle link carries one heartbeat per interval.
func (p *peer) watch() {
	defer p.t.watchers.Done()
	live := p.t.live
	every := live.Interval
	tick := time.NewTicker(every / 2)
	defer tick.Stop()
	announced := p.heartbeat(every / 2) // tells the peer which interval this rank needs
	quiet := 0
	prev, wasLate := time.Now(), false
	for {
		select {
		case <-p.gone:
			return
		case <-p.nudge:
			// The peer checks more often than this rank would send: follow
			// its interval, and answer at once.
			if d := time.Duration(p.asked.Load()); d > 0 && d < every {
				every = d
				tick.Reset(every / 2)
			}
			if !p.sent.Swap(false) {
				announced = p.heartbeat(every/2) || announced
			}
			quiet = 0
			continue
		case <-tick.C:
		}
		now := time.Now()
		// A tick far behind its schedule means this process did not run
		// (it was stopped, or the machine is swamped): the peer's bytes
		// may be waiting unread in the socket, so judge it next time (but
		// not never, should every tick come late).
		late := now.Sub(prev) > 2*every && !wasLate
		prev, wasLate = now, late
		if live.Timeout > 0 && !late {
			limit := live.Timeout
			if p.heard.Load() == 0 {
				limit += setupGrace
			}
			if last := p.lastHeard(); now.Sub(last) >= limit {
				p.failUnresponsive(last, nil)
				return
			}
		}
		if p.sent.Swap(false) && announced {
			quiet = 0
			continue
		}
		if quiet++; quiet >= 2 || !announced {
			if p.heartbeat(every / 2) {
				announced, quiet = true, 0
			}
		}
	}
}

// heartbeat writes a heartbeat frame unless a write holds the line; it
// reports whether it wrote one. It waits at most wait for room in the
// socket, so that the watcher goes on judging the peer: a socket that
// stays full means the peer has this rank's data still to read, which
// proves this rank alive as well. Should only part of the frame get out
// in that time, the rest is written on the side, holding the line as any
// write does, until it goes out or the link fails.
func (p *peer) heartbeat(wait time.Duration) bool {
	select {
	case p.wsem <- struct{}{}:
	default:
		return false // a write is under way: that proves this rank alive
	}
	if p.wclosed || p.goneErr() != nil {
		p.unlock()
		return false
	}
	var ask uint64
	if p.t.live.Timeout > 0 {
		ask = uint64(p.t.live.Interval / time.Millisecond)
	}
	putHeader(&p.whdr, frameHeartbeat, 0, ask)
	p.conn.SetWriteDeadline(time.Now().Add(wait))
	n, err := p.conn.Write(p.whdr[:])
	p.conn.SetWriteDeadline(time.Time{})
	switch {
	case err == nil:
		p.unlock()
		return true
	case p.goneErr() != nil || p.t.downErr() != nil:
		p.unlock()
		return false // cut by Abort, Close or a failure elsewhere
	case errors.Is(err, os.ErrDeadlineExceeded) && n == 0:
		p.unlock()
		return false
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.t.watchers.Add(1) // the watcher's own count keeps Close waiting meanwhile
		go func() {
			defer p.t.watchers.Done()
			defer p.unlock()
			if _, err := p.conn.Write(p.whdr[n:]); err != nil && p.goneErr() == nil && p.t.downErr() == nil {
				p.fail(p.lostErr("connection failed while sending a heartbeat: %w", err))
				p.cutConn()
			}
		}()
		return true
	default:
		p.fail(p.lostErr("connection failed while sending a heartbeat: %w", err))
		p.cutConn()
		p.unlock()
		return false
	}
}

// failUnresponsive fails the peer as unresponsive since last and cuts the
// connection, which ends its reader and any write blocked on it. cause is
// the system's error when the kernel gave up on the link (TCP_USER_TIMEOUT),
// nil when the watcher did.
func (p *peer) failUnresponsive(last time.Time, cause error) {
	err := p.unresponsiveErr(last, cause)
	p.fail(err)
	p.cutConn()
}

func (p *peer) unresponsiveErr(last time.Time, cause error) error {
	if cause != nil {
		return p.lostErr("is %s (the kernel gave up on data it never acknowledged: %w); if the link is only slow or lossy, raise the peer timeout (tcp.WithPeerTimeout, comm.WithPeerTimeout)",
			liveness.Unresponsive(last), cause)
	}
	return p.lostErr("is %s; if the link is only slow or lossy, raise the peer timeout (tcp.WithPeerTimeout, comm.WithPeerTimeout)",
		liveness.Unresponsive(last))
}
