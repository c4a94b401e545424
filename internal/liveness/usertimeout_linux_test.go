package liveness

import (
	"net"
	"testing"
	"time"
)

func TestSetUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			var b [1]byte
			c.Read(b[:])
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := SetUserTimeout(c, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	got, err := userTimeout(c.(*net.TCPConn))
	if err != nil || got != 3*time.Second {
		t.Fatalf("TCP_USER_TIMEOUT reads back %v (%v), want 3s", got, err)
	}
}
