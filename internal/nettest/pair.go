package nettest

import (
	"net"
	"testing"
)

// TCPPair returns the two ends of a loopback TCP connection, closed when
// the test ends.
func TCPPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan *net.TCPConn, 1)
	go func() {
		c, _ := ln.AcceptTCP()
		done <- c
	}()
	a, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	if b = <-done; b == nil {
		t.Fatal("nettest: accepting the loopback connection failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
