//go:build !linux

package liveness

import (
	"net"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not available; the
// heartbeats still notice a silent peer.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
