// Package nettest holds network helpers for tests that speak to Tandem's
// servers and ranks on the wire. A Tap is a recording TCP proxy: put it
// between a client and a server, let them talk through it, and read back
// every byte that crossed it, both ways; the authentication tests use it to
// show that a handshake's bytes hold no trace of the shared token. ServeOne
// stands in for a peer that the test speaks for by hand (an old version, an
// impostor).
//
//	tap := nettest.NewTap(t)
//	tap.Forward(srv.Addr())
//	// ... dial tap.Addr() instead of the server ...
//	if piece := nettest.Leaked(tap.Bytes(), token); piece != "" {
//		t.Fatalf("the token's bytes %q appear on the wire", piece)
//	}
package nettest

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Tap is a loopback proxy that forwards every connection it accepts to one
// target and keeps every byte it forwards, both ways.
type Tap struct {
	ln     net.Listener
	target chan string
	mu     sync.Mutex
	buf    bytes.Buffer
}

// NewTap starts a tap on a free loopback port; it stops listening when the
// test ends. Connections wait for Forward to name the target, so that a tap
// can stand in for an address that is only known later.
func NewTap(t testing.TB) *Tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &Tap{ln: ln, target: make(chan string, 1)}
	t.Cleanup(func() { ln.Close() })
	go w.serve()
	return w
}

// Forward names the address the tap forwards to. Call it once.
func (w *Tap) Forward(target string) { w.target <- target }

// Addr returns the address to dial instead of the target's.
func (w *Tap) Addr() string { return w.ln.Addr().String() }

// Bytes returns a copy of everything the tap has forwarded so far, both
// ways, interleaved as it crossed.
func (w *Tap) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

func (w *Tap) serve() {
	target := ""
	for {
		c, err := w.ln.Accept()
		if err != nil {
			return
		}
		if target == "" {
			target = <-w.target
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		go w.copy(s, c)
		go w.copy(c, s)
	}
}

// copy forwards src to dst, recording what it forwards, until either end
// fails; then it closes both.
func (w *Tap) copy(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		w.mu.Lock()
		w.buf.Write(buf[:n])
		w.mu.Unlock()
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Leaked returns the first of the secrets, or of their halves, that appears
// in seen, or "" if none does: half a token on the wire is a leak too.
func Leaked(seen []byte, secrets ...string) string {
	for _, s := range secrets {
		for _, piece := range []string{s, s[:len(s)/2], s[len(s)/2:]} {
			if piece != "" && bytes.Contains(seen, []byte(piece)) {
				return piece
			}
		}
	}
	return ""
}

// ServeOne listens on a free loopback port until the test ends, hands the
// first connection it accepts to serve, in a goroutine of its own, and
// closes that connection when serve returns. It returns the address to
// dial.
func ServeOne(t testing.TB, serve func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	return ln.Addr().String()
}
