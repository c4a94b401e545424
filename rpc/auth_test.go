package rpc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/nettest"
	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// A call between two workers goes through a wiretap: it works, and the
// bytes of its handshake (and of the whole connection) hold no trace of the
// token. A worker with another token, through the same tap, is refused on
// both sides, and its bytes hold neither token.
func TestTokenNeverOnTheWire(t *testing.T) {
	const token = "rpc-tok-5d81e2-never-on-the-wire"
	const other = "rpc-tok-other-never-on-the-wire"
	logs := &testlog.Buffer{}
	st := store.NewMemory()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agents := mustInitEach(t, ctx, 3, func(r int) (string, []Option) {
		tok := token
		if r == 2 {
			tok = other
		}
		return "", []Option{WithStore(st), WithRegistry(basics(r)), WithToken(tok),
			WithListenAddr("127.0.0.1:0"), WithLogger(logs.Logger())}
	})
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()
	// Rank 0 and rank 2 reach rank 1 through the tap; no call has been
	// made yet, so no connection exists.
	tap := nettest.NewTap(t)
	tap.Forward(agents[1].addrs[1])
	agents[0].addrs[1] = tap.Addr()
	agents[2].addrs[1] = tap.Addr()
	if v, err := Sync[int](ctx, agents[0], "worker1", "add", [2]int{1, 2}); err != nil || v != 3 {
		t.Fatalf("call through the tap: %v %v", v, err)
	}
	_, err := Sync[int](ctx, agents[2], "worker1", "add", [2]int{1, 2})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "refused this worker's token") {
		t.Fatalf("call with another token: %v, want ErrUnauthorized", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "wrong token") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "wrong token: the caller could not prove") {
		t.Fatalf("the acceptor did not log the refusal:\n%s", logs)
	}
	if agents[1].Metrics().ConnectionsRefused == 0 {
		t.Fatal("the acceptor did not count the refusal")
	}
	seen := tap.Bytes()
	if n := bytes.Count(seen, []byte(helloMagic)); n != 2 {
		t.Fatalf("the tap saw %d hellos, want 2 (%d bytes)", n, len(seen))
	}
	if needle := nettest.Leaked(seen, token, other); needle != "" {
		t.Fatalf("the token's bytes %q appear on the wire", needle)
	}
}

// handAuth dials addr for a handshake made by hand, returning the
// connection and its reader.
func handAuth(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return nc, bufio.NewReader(nc)
}

// A dialler's recorded hello and proof, sent again byte for byte on a new
// connection, are refused: the acceptor's nonce is fresh.
func TestReplayedProofRefused(t *testing.T) {
	agents := startGroup(t, 2, registerBasics, WithToken("right"))
	addr := agents[1].ln.Addr().String()
	dn, _ := tokenauth.NewNonce()
	hdr := helloHeader(0)
	hello := append(hdr[:], dn[:]...)

	nc, br := handAuth(t, addr)
	nc.Write(hello)
	status, _, err := readStatus(br)
	if err != nil || status != statusOK {
		t.Fatalf("challenge: %d %v", status, err)
	}
	var an tokenauth.Nonce
	io.ReadFull(br, an[:])
	mac := tokenauth.NewKey([]byte("right"), authProtocol).Prove(tokenauth.Dialer, dn, an, hdr[:])
	proof := cmaHello{}.append(append([]byte(nil), mac[:]...))
	nc.Write(proof)
	if status, msg, err := readStatus(br); err != nil || status != statusOK {
		t.Fatalf("genuine proof: %d %q %v", status, msg, err)
	}

	nc2, br2 := handAuth(t, addr)
	nc2.Write(hello)
	if status, _, err := readStatus(br2); err != nil || status != statusOK {
		t.Fatalf("replayed hello: %d %v", status, err)
	}
	io.CopyN(io.Discard, br2, tokenauth.NonceSize)
	nc2.Write(proof)
	status, msg, err := readStatus(br2)
	if err != nil || status != statusBadToken || !strings.Contains(msg, "wrong token") {
		t.Fatalf("replayed proof: status %d %q %v, want statusBadToken", status, msg, err)
	}
	if !closedByPeer(br2) {
		t.Fatal("the acceptor kept the connection of a replayed proof")
	}
}

// A listener that takes the hello and answers with a made-up verdict (it
// does not hold the token) is refused by the dialler with ErrUnauthorized;
// it also never sees the token.
func TestImpostorAcceptorRefused(t *testing.T) {
	got := make(chan []byte, 1)
	addr := nettest.ServeOne(t, func(c net.Conn) {
		var all []byte
		buf := make([]byte, helloHeaderLen+tokenauth.NonceSize)
		io.ReadFull(c, buf)
		all = append(all, buf...)
		var n tokenauth.Nonce
		c.Write(append([]byte{statusOK, 0, 0}, n[:]...))
		buf = make([]byte, tokenauth.MACSize+cmaHelloLen)
		io.ReadFull(c, buf)
		all = append(all, buf...)
		var fake tokenauth.MAC
		c.Write(append([]byte{statusOK, 0, 0}, fake[:]...))
		got <- all
		io.Copy(io.Discard, c)
	})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	token := []byte("the-real-token-1234")
	_, _, err = dialAuth(nc, bufio.NewReader(nc), token, 0, cmaHello{}.append(nil))
	if !errors.Is(err, errImpostor) {
		t.Fatalf("dialAuth against an impostor: %v, want errImpostor", err)
	}
	if b := <-got; bytes.Contains(b, token) || bytes.Contains(b, token[:8]) {
		t.Fatal("the impostor received the token's bytes")
	}
}

// A hello of RPC protocol version 2 (which carried the token) is refused
// with a message naming both versions.
func TestOldProtocolRefused(t *testing.T) {
	agents := startGroup(t, 2, registerBasics, WithToken("right"))
	nc, br := handAuth(t, agents[1].ln.Addr().String())
	hello := append([]byte(helloMagic), 2, 0, 0, 0, 0, 5, 0)
	hello = append(hello, "right"...)
	nc.Write(cmaHello{}.append(hello))
	status, msg, err := readStatus(br)
	if err != nil || status != statusBadHello || !strings.Contains(msg, "RPC protocol version 2, this worker version 4") {
		t.Fatalf("version-2 hello: status %d %q %v", status, msg, err)
	}

	// A worker of version 2 reads the first 14 bytes and refuses the
	// version as version 2 did.
	agents[0].addrs[1] = nettest.ServeOne(t, func(c net.Conn) {
		var h [helloHeaderLen]byte
		io.ReadFull(c, h[:])
		msg := "not a Tandem RPC hello of version 2 (another program, or a worker of another Tandem version)"
		c.Write(append([]byte{statusBadHello, byte(len(msg)), 0}, msg...))
	})
	_, err = Sync[int](context.Background(), agents[0], "w1", "add", [2]int{1, 2})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "version 2") || !strings.Contains(err.Error(), "RPC protocol version 4") {
		t.Fatalf("calling a version-2 worker: %v, want ErrMismatch naming both versions", err)
	}
}
