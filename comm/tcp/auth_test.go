package tcp

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/nettest"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// tappedStore hands out the tap's address for rank 0, once it has passed
// rank 0's real one to the tap.
type tappedStore struct {
	store.Store
	tap  *nettest.Tap
	once sync.Once
}

func (s *tappedStore) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := s.Store.Get(ctx, key)
	if err != nil || key != addrKey(0) {
		return v, err
	}
	s.once.Do(func() { s.tap.Forward(strings.Split(string(v), ",")[0]) })
	return []byte(s.tap.Addr()), nil
}

// Rank 1 reaches rank 0 through a wiretap: the mesh comes up and carries a
// message, and the bytes of the handshake (and of the whole connection)
// hold no trace of the token. A rank 1 with another token, through the same
// kind of tap, is refused on both sides, and its bytes hold neither token.
func TestTokenNeverOnTheWire(t *testing.T) {
	const token = "tcp-tok-41c7-never-on-the-wire"
	const other = "tcp-tok-other-never-on-the-wire"
	for _, wrong := range []bool{false, true} {
		st := newStore(t)
		tap := nettest.NewTap(t)
		tapped := &tappedStore{Store: st, tap: tap}
		ts, errs := connectWorld(2, st, func(rank int, cfg *transport.Config) {
			cfg.Token = token
			cfg.Timeout = 3 * time.Second
			if rank == 1 {
				cfg.Store = tapped
				if wrong {
					cfg.Token = other
				}
			}
		})
		if !wrong {
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d through the tap: %v", r, err)
				}
			}
			ctx := ctxTimeout(t, 10*time.Second)
			done := make(chan error, 1)
			go func() { done <- ts[1].Send(ctx, 0, 7, []byte("payload through the tap")) }()
			got := make([]byte, len("payload through the tap"))
			if err := ts[0].Recv(ctx, 1, 7, got); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			for _, tr := range ts {
				tr.Close()
			}
		} else {
			if !errors.Is(errs[1], transport.ErrUnauthorized) {
				t.Fatalf("rank 1 with another token: %v, want ErrUnauthorized", errs[1])
			}
			mustContain(t, errs[1], "token does not match")
			if !errors.Is(errs[0], transport.ErrUnauthorized) {
				t.Fatalf("rank 0 facing another token: %v, want ErrUnauthorized", errs[0])
			}
			mustContain(t, errs[0], "token does not match")
		}
		seen := tap.Bytes()
		if !bytes.Contains(seen, magic[:]) {
			t.Fatalf("wrong token %v: the tap saw no handshake (%d bytes)", wrong, len(seen))
		}
		if !wrong && !bytes.Contains(seen, []byte("payload through the tap")) {
			t.Fatalf("the tap missed the traffic (%d bytes)", len(seen))
		}
		if needle := nettest.Leaked(seen, token, other); needle != "" {
			t.Fatalf("wrong token %v: the token's bytes %q appear on the wire", wrong, needle)
		}
	}
}

// acceptorOf starts rank 0 of a world of 3 with token, and returns its
// address and the run nonce once it has published them; rank 0's Connect
// result comes on the channel.
func acceptorOf(t *testing.T, token string) (string, [runNonceSize]byte, chan error) {
	t.Helper()
	st := newStore(t)
	res := make(chan error, 1)
	go func() {
		tr, err := loopback.ConnectTCP(context.Background(), transport.Config{Rank: 0, Size: 3, Store: st, Timeout: 2 * time.Second, Token: token})
		if tr != nil {
			tr.Close()
		}
		res <- err
	}()
	ctx := ctxTimeout(t, 10*time.Second)
	a, err := st.Get(ctx, addrKey(0))
	if err != nil {
		t.Fatal(err)
	}
	n, err := st.Get(ctx, keyNonce)
	if err != nil {
		t.Fatal(err)
	}
	var run [runNonceSize]byte
	hex.Decode(run[:], n)
	return strings.Split(string(a), ",")[0], run, res
}

// A dialer's recorded hello and proof, sent again byte for byte on a new
// connection, are refused: the acceptor's nonce is fresh.
func TestReplayedHandshakeRefused(t *testing.T) {
	const token = "right"
	addr, run, res := acceptorOf(t, token)
	key := tokenauth.NewKey([]byte(token), authProtocol)
	h := hello{kind: kindHello, rank: 2, size: 3, peer: 0, nonce: run}
	h.data, _ = tokenauth.NewNonce()
	var hb, pb bytes.Buffer
	writeHello(&hb, &h)

	c1, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c1.SetDeadline(time.Now().Add(5 * time.Second))
	c1.Write(hb.Bytes())
	ch, err := readHello(c1, kindChallenge)
	if err != nil {
		t.Fatal(err)
	}
	writeHello(&pb, &hello{kind: kindProof, rank: 2, size: 3, nonce: run, data: proveDialer(key, &h, ch)})
	c1.Write(pb.Bytes())
	r, err := readHello(c1, kindReply)
	if err != nil || r.status != statusOK {
		t.Fatalf("genuine handshake: %+v %v", r, err)
	}
	if !key.Verify(tokenauth.Acceptor, h.data, ch.data, r.data, h.body(), ch.body(), r.body()) {
		t.Fatal("the acceptor's MAC does not verify")
	}

	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	c2.Write(hb.Bytes())
	if _, err := readHello(c2, kindChallenge); err != nil {
		t.Fatal(err)
	}
	c2.Write(pb.Bytes())
	r, err = readHello(c2, kindReply)
	if err != nil || r.status != statusUnauthorized {
		t.Fatalf("replayed handshake: %+v %v, want statusUnauthorized", r, err)
	}
	if r.data != ([tokenauth.NonceSize]byte{}) {
		t.Fatal("the acceptor proved itself to a dialer that did not")
	}
	err = <-res // rank 1 never came
	if !errors.Is(err, transport.ErrUnauthorized) {
		t.Fatalf("rank 0: %v, want ErrUnauthorized", err)
	}
	mustContain(t, err, "claiming rank 2: token does not match")
}

// A hello of process-group protocol version 3 gets a reply of version 4
// naming the mismatch, and a dialer that meets a rank of another version
// gives up at once saying so.
func TestOtherVersionRefused(t *testing.T) {
	addr, run, res := acceptorOf(t, "right")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	writeHello(&b, &hello{kind: kindHello, rank: 1, size: 3, nonce: run})
	old := b.Bytes()
	old[4] = 3
	c.Write(old)
	r, err := readHello(c, kindReply)
	if err != nil || r.status != statusVersion {
		t.Fatalf("version-3 hello: %+v %v, want statusVersion", r, err)
	}
	err = <-res
	mustContain(t, err, "protocol version 3, this rank version 4")

	// A rank that answers in version 3.
	old3 := nettest.ServeOne(t, func(c net.Conn) {
		var rec [helloSize]byte
		if _, err := io.ReadFull(c, rec[:]); err != nil {
			return
		}
		rec[4], rec[5] = 3, kindReply
		c.Write(rec[:])
	})
	st := newStore(t)
	ctx := ctxTimeout(t, 10*time.Second)
	st.Set(ctx, keyNonce, []byte(hex.EncodeToString(run[:])))
	st.Set(ctx, addrKey(0), []byte(old3))
	start := time.Now()
	_, err = loopback.ConnectTCP(ctx, transport.Config{Rank: 1, Size: 2, Store: st, Timeout: 5 * time.Second, Token: "right"})
	if !errors.Is(err, transport.ErrMismatch) || time.Since(start) > 3*time.Second {
		t.Fatalf("dialing a version-3 rank: %v after %v, want ErrMismatch at once", err, time.Since(start))
	}
	mustContain(t, err, "protocol version 3, this rank version 4")
}
