package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/nettest"
	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// rawHello runs the client's side of the handshake by hand on c with
// session id and token, and returns the server's last reply (the verdict, or
// the refusal that came instead of the challenge).
func rawHello(t *testing.T, c net.Conn, session uint64, token string) message {
	t.Helper()
	c.SetDeadline(time.Now().Add(long))
	defer c.SetDeadline(time.Time{})
	mine, err := tokenauth.NewNonce()
	noErr(t, err)
	h := message{op: opHello, id: session, num: protoVersion, keys: []string{protoMagic, authScheme}, vals: [][]byte{mine[:]}}
	_, err = c.Write(appendFrame(nil, &h))
	noErr(t, err)
	r := readReply(t, c)
	if r.code != codeOK {
		return r
	}
	key := tokenauth.NewKey([]byte(token), protoMagic)
	proof := message{op: opHello, id: session, num: protoVersion}
	if token != "" {
		mac := key.Prove(tokenauth.Dialer, mine, tokenauth.Nonce(r.vals[0]), helloBind(session, r.num == 1))
		proof.vals = [][]byte{mac[:]}
	}
	_, err = c.Write(appendFrame(nil, &proof))
	noErr(t, err)
	return readReply(t, c)
}

func readReply(t *testing.T, c net.Conn) message {
	t.Helper()
	p, err := readFrame(c, 1<<16)
	noErr(t, err)
	r, err := decodeMessage(p)
	noErr(t, err)
	return r
}

// The bytes of real handshakes, as both ends saw them, hold no trace of
// the token: not the token, not its first half, not its hex.
func TestTCPTokenNeverOnTheWire(t *testing.T) {
	const token = "tok-7f3a9c-never-on-the-wire"
	srv, err := NewServer("127.0.0.1:0", WithToken(token), WithLogger(quietLogger()))
	noErr(t, err)
	// A proxy between client and server records the whole stream, both
	// ways, of an accepted connection and of a refused one.
	tap := nettest.NewTap(t)
	tap.Forward(srv.Addr())
	go srv.Serve(context.Background())
	defer srv.Close()
	ctx := ctxFor(t, long)
	c, err := Dial(ctx, tap.Addr(), WithToken(token), WithLogger(quietLogger()))
	noErr(t, err)
	noErr(t, c.Set(ctx, "k", []byte("v")))
	noErr(t, c.Close())
	if _, err := Dial(ctx, tap.Addr(), WithToken(token+"-wrong"), WithLogger(quietLogger())); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a wrong token through the proxy: %v, want ErrUnauthorized", err)
	}
	time.Sleep(50 * time.Millisecond) // the proxy's last copies
	seen := tap.Bytes()
	if !bytes.Contains(seen, []byte(protoMagic)) || !bytes.Contains(seen, []byte("k")) {
		t.Fatalf("the recording missed the traffic (%d bytes)", len(seen))
	}
	if needle := nettest.Leaked(seen, token); needle != "" {
		t.Fatalf("the token's bytes %q appear on the wire", needle)
	}
}

// Both ends refuse a wrong token with ErrUnauthorized and say why; a client
// with a token refuses a server without one.
func TestTCPTokenRefusedBothSides(t *testing.T) {
	logs := &testlog.Buffer{}
	srv := startServer(t, WithToken("right"), WithLogger(logs.Logger()))
	ctx := ctxFor(t, long)
	_, err := Dial(ctx, srv.Addr(), WithToken("wrong"), WithLogger(quietLogger()))
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "could not prove that it holds the server's token") {
		t.Fatalf("client with the wrong token: %v, want ErrUnauthorized saying why", err)
	}
	if !strings.Contains(logs.String(), "wrong token") {
		t.Fatalf("server log lacks the reason:\n%s", logs)
	}

	open := startServer(t, WithToken(""))
	_, err = Dial(ctx, open.Addr(), WithToken("right"), WithLogger(quietLogger()))
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "has no token but this client has one") {
		t.Fatalf("client with a token, server without: %v, want ErrUnauthorized saying why", err)
	}
	// A server without a token takes a client without one.
	c := dialT(t, open.Addr(), WithToken(""))
	noErr(t, c.Set(ctx, "k", nil))
}

// An impostor server that does not hold the token (here: one that answers
// the challenge and then sends a verdict it made up) is refused by the
// client, and a recorded verdict replayed on a new connection does not
// verify: the client's nonce is fresh.
func TestTCPImpostorServerRefused(t *testing.T) {
	const token = "right"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	defer ln.Close()
	// First a genuine server's verdict is recorded through rawHello's
	// transcript; the impostor then replays it.
	srv := startServer(t, WithToken(token))
	rc, err := net.Dial("tcp", srv.Addr())
	noErr(t, err)
	defer rc.Close()
	recorded := rawHello(t, rc, 9, token)
	if recorded.code != codeOK || len(recorded.vals) != 1 {
		t.Fatalf("genuine handshake: %+v", recorded)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := readFrame(c, 1<<16); err != nil {
					return
				}
				var n tokenauth.Nonce
				c.Write(appendFrame(nil, &message{op: opReply, code: codeOK, num: 1, vals: [][]byte{n[:]}}))
				if _, err := readFrame(c, 1<<16); err != nil {
					return
				}
				c.Write(appendFrame(nil, &message{op: opReply, code: codeOK, vals: recorded.vals}))
				io.Copy(io.Discard, c)
			}()
		}
	}()
	_, err = Dial(ctxFor(t, long), ln.Addr().String(), WithToken(token), WithLogger(quietLogger()))
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "could not prove that it holds this client's token") {
		t.Fatalf("impostor server: %v, want ErrUnauthorized", err)
	}
}

// A client's recorded proof does not open a second connection: the
// server's nonce is fresh.
func TestTCPReplayedProofRefused(t *testing.T) {
	const token = "right"
	srv := startServer(t, WithToken(token))
	c1, err := net.Dial("tcp", srv.Addr())
	noErr(t, err)
	defer c1.Close()
	mine, _ := tokenauth.NewNonce()
	hello := appendFrame(nil, &message{op: opHello, id: 5, num: protoVersion, keys: []string{protoMagic, authScheme}, vals: [][]byte{mine[:]}})
	c1.Write(hello)
	ch := readReply(t, c1)
	mac := tokenauth.NewKey([]byte(token), protoMagic).Prove(tokenauth.Dialer, mine, tokenauth.Nonce(ch.vals[0]), helloBind(5, true))
	proof := appendFrame(nil, &message{op: opHello, id: 5, num: protoVersion, vals: [][]byte{mac[:]}})
	c1.Write(proof)
	if r := readReply(t, c1); r.code != codeOK {
		t.Fatalf("genuine proof refused: %+v", r)
	}
	// Replay both frames, byte for byte, on a new connection.
	c2, err := net.Dial("tcp", srv.Addr())
	noErr(t, err)
	defer c2.Close()
	c2.Write(hello)
	if r := readReply(t, c2); r.code != codeOK {
		t.Fatalf("replayed hello: %+v", r)
	}
	c2.Write(proof)
	if r := readReply(t, c2); r.code != codeUnauthorized {
		t.Fatalf("replayed proof: code %d, want codeUnauthorized", r.code)
	}
}

// A client of store protocol version 1 (which sent the token in its hello)
// and this server refuse each other with a message naming the protocol
// version.
func TestTCPOldProtocolRefused(t *testing.T) {
	srv := startServer(t, WithToken("right"))
	c, err := net.Dial("tcp", srv.Addr())
	noErr(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(long))
	c.Write(appendFrame(nil, &message{op: opHello, num: 1, keys: []string{protoMagic, "right"}}))
	r := readReply(t, c)
	if r.code != codeInvalid || len(r.vals) != 1 || !strings.Contains(string(r.vals[0]), "protocol version 1, server version 2") {
		t.Fatalf("v1 hello: %+v, want codeInvalid naming the versions", r)
	}
	// A version-1 server: it reads the hello's two keys and its version.
	v1 := nettest.ServeOne(t, func(s net.Conn) {
		p, err := readFrame(s, 1<<16)
		if err != nil {
			return
		}
		m, err := decodeMessage(p)
		if err != nil || len(m.keys) != 2 || m.keys[0] != protoMagic || m.num == 1 {
			return
		}
		s.Write(appendFrame(nil, &message{op: opReply, code: codeInvalid, id: m.id,
			vals: [][]byte{[]byte("store server: client speaks store protocol 2, server speaks 1")}}))
	})
	_, err = Dial(ctxFor(t, long), v1, WithToken("right"), WithLogger(quietLogger()))
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "protocol version 2") {
		t.Fatalf("new client, old server: %v, want ErrInvalidArgument naming the protocol version", err)
	}
}
