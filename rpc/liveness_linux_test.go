package rpc

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestUserTimeoutSet: both ends of a connection carry TCP_USER_TIMEOUT
// equal to the liveness timeout, so that a write left unacknowledged fails
// then rather than after TCP's minutes of retransmissions.
func TestUserTimeoutSet(t *testing.T) {
	const timeout = 2 * time.Second
	agents := startGroup(t, 2, registerBasics, WithLivenessTimeout(timeout))
	if _, err := Sync[int](context.Background(), agents[0], "w1", "add", [2]int{1, 1}); err != nil {
		t.Fatal(err)
	}
	agents[1].mu.Lock()
	var server *conn
	for c := range agents[1].servers {
		server = c
	}
	agents[1].mu.Unlock()
	for name, c := range map[string]*conn{"client": agents[0].peers[1].cur.Load(), "server": server} {
		if c == nil {
			t.Fatalf("no %s connection", name)
		}
		rc, err := c.nc.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var ms int
		var serr error
		rc.Control(func(fd uintptr) { ms, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12) })
		if serr != nil || time.Duration(ms)*time.Millisecond != timeout {
			t.Fatalf("%s connection: TCP_USER_TIMEOUT %dms (%v), want %v", name, ms, serr, timeout)
		}
	}
}
