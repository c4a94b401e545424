// Package liveness holds what Tandem's connections share to notice a peer
// that is frozen (stopped, swapped out, deadlocked in the kernel) or
// unreachable (a cut link, a dead machine) long before an operation's own
// timeout ends.
//
// Two mechanisms cover the two ways a link goes quiet:
//
//   - Heartbeats: each side of an idle connection sends a small frame every
//     Interval, and each side treats Timeout without any bytes from the peer
//     as the peer being unresponsive. A stopped process's kernel still
//     acknowledges TCP segments, so only a message from the process itself
//     proves it alive.
//   - TCP_USER_TIMEOUT (Linux): a write whose data stays unacknowledged for
//     Timeout fails, where TCP's own retransmissions would go on for about
//     15 minutes and keepalive never starts while data is outstanding.
//
// The protocols that carry the heartbeats (comm/tcp's frames, RPC's frames)
// define their own heartbeat frame; this package holds the defaults, the
// socket option and the error text, so that every layer reports an
// unresponsive peer the same way.
package liveness

import (
	"fmt"
	"net"
	"time"
)

// Defaults: a frozen or unreachable peer is noticed within about Timeout.
const (
	// Interval is how often an idle connection sends a heartbeat.
	Interval = time.Second
	// Timeout is how long a connection may go without a byte from its peer
	// before the peer counts as unresponsive.
	Timeout = 5 * time.Second
)

// Config is one connection's liveness settings. A zero Timeout means the
// default; a negative Timeout turns the check off (heartbeats are still
// answered).
type Config struct {
	Interval time.Duration
	Timeout  time.Duration
}

// Resolve fills a Config's zero fields with the defaults. The interval is
// kept at most a third of the timeout, so that one late heartbeat is not
// taken for a dead peer.
func (c Config) Resolve() Config {
	if c.Timeout == 0 {
		c.Timeout = Timeout
	}
	if c.Interval <= 0 {
		c.Interval = Interval
	}
	if c.Timeout > 0 && c.Interval > c.Timeout/3 {
		c.Interval = c.Timeout / 3
	}
	return c
}

// Enabled reports whether the check is on.
func (c Config) Enabled() bool { return c.Resolve().Timeout > 0 }

// Unresponsive describes a peer that has sent nothing since last, for use
// in an error message: "unresponsive: nothing received for 5.2s (since
// 14:02:11.532)".
func Unresponsive(last time.Time) string {
	return fmt.Sprintf("unresponsive: nothing received for %s (since %s); the process is frozen (stopped, swapped out, stuck in the kernel) or the link to it is cut",
		time.Since(last).Round(100*time.Millisecond), last.Format("15:04:05.000"))
}

// SetUserTimeout sets TCP_USER_TIMEOUT on c where the system has it, so a
// write that stays unacknowledged for d fails instead of retrying for
// minutes. It does nothing for d <= 0 or a connection that is not TCP.
func SetUserTimeout(c net.Conn, d time.Duration) error {
	tc, ok := c.(*net.TCPConn)
	if !ok || d <= 0 {
		return nil
	}
	return setUserTimeout(tc, d)
}
