package tcp

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/tokenauth"
)

func TestWrongTokenIsRefused(t *testing.T) {
	st := newStore(t)
	ts, errs := connectWorld(2, st, func(rank int, cfg *transport.Config) {
		cfg.Timeout = 2 * time.Second
		if rank == 1 {
			cfg.Token = "wrong"
		}
	})
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
	// The dialer (rank 1) is told at once; the acceptor (rank 0) times out
	// waiting for a legitimate rank 1 and says what it refused.
	if !errors.Is(errs[1], transport.ErrUnauthorized) {
		t.Errorf("rank 1: want ErrUnauthorized, got %v", errs[1])
	}
	mustContain(t, errs[1], "token")
	if !errors.Is(errs[0], transport.ErrTimeout) || !errors.Is(errs[0], transport.ErrUnauthorized) {
		t.Errorf("rank 0: want ErrTimeout and ErrUnauthorized, got %v", errs[0])
	}
	mustContain(t, errs[0], "[1]", "token does not match")
}

func TestEmptyTokenAgainstTokenIsRefused(t *testing.T) {
	st := newStore(t)
	_, errs := connectWorld(2, st, func(rank int, cfg *transport.Config) {
		cfg.Timeout = time.Second
		if rank == 0 {
			cfg.Token = ""
		}
	})
	if !errors.Is(errs[1], transport.ErrUnauthorized) {
		t.Errorf("rank 1: want ErrUnauthorized, got %v", errs[1])
	}
}

func TestWorldSizeMismatchNamesBoth(t *testing.T) {
	st := newStore(t)
	ts, errs := connectWorld(2, st, func(rank int, cfg *transport.Config) {
		cfg.Timeout = 5 * time.Second
		if rank == 1 {
			cfg.Size = 3
		}
	})
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
	for r, err := range errs {
		if !errors.Is(err, transport.ErrMismatch) {
			t.Errorf("rank %d: want ErrMismatch, got %v", r, err)
			continue
		}
		mustContain(t, err, "world size 2", "world size 3")
	}
}

func TestMissingRanksAreNamed(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	// World of 4; only ranks 0 and 2 start.
	done := make(chan error, 2)
	for _, r := range []int{0, 2} {
		go func() {
			tr, err := loopback.Connect(ctx, transport.Config{Rank: r, Size: 4, Store: st, Timeout: time.Second})
			if tr != nil {
				tr.Close()
			}
			done <- err
		}()
	}
	for i := 0; i < 2; i++ {
		err := <-done
		if !errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("want ErrTimeout wrapping DeadlineExceeded, got %v", err)
			continue
		}
		mustContain(t, err, "never published")
	}
}

func TestConnectHonoursCancel(t *testing.T) {
	st := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	_, err := loopback.Connect(ctx, transport.Config{Rank: 1, Size: 2, Store: st})
	if errors.Is(err, transport.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled and not ErrTimeout, got %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	st := newStore(t)
	for name, cfg := range map[string]transport.Config{
		"rank out of range": {Rank: 2, Size: 2, Store: st},
		"negative rank":     {Rank: -1, Size: 2, Store: st},
		"zero world":        {Rank: 0, Size: 0, Store: st},
		"no store":          {Rank: 0, Size: 2},
		"negative max":      {Rank: 0, Size: 2, Store: st, MaxMessage: -1},
	} {
		if _, err := loopback.Connect(context.Background(), cfg); !errors.Is(err, transport.ErrInvalidArgument) {
			t.Errorf("%s: want ErrInvalidArgument, got %v", name, err)
		}
	}
}

func TestHelloRoundTripAndTamper(t *testing.T) {
	key := tokenauth.NewKey([]byte("tok"), authProtocol)
	h := hello{kind: kindHello, rank: 3, size: 8, peer: 1}
	copy(h.nonce[:], "0123456789abcdef")
	h.data, _ = tokenauth.NewNonce()
	ch := hello{kind: kindChallenge, rank: 1, size: 8, peer: 3, nonce: h.nonce}
	ch.data, _ = tokenauth.NewNonce()
	var buf bytes.Buffer
	if err := writeHello(&buf, &h); err != nil {
		t.Fatal(err)
	}
	wire := append([]byte(nil), buf.Bytes()...)
	got, err := readHello(&buf, kindHello)
	if err != nil {
		t.Fatal(err)
	}
	if *got != h {
		t.Fatalf("round trip changed the hello: %+v vs %+v", got, h)
	}
	mac := proveDialer(key, &h, &ch)
	if !key.Verify(tokenauth.Dialer, got.data, ch.data, mac, got.body(), ch.body()) {
		t.Fatal("the proof does not verify over the decoded hello")
	}
	if tokenauth.NewKey([]byte("other"), authProtocol).Verify(tokenauth.Dialer, got.data, ch.data, mac, got.body(), ch.body()) {
		t.Fatal("a proof verified under another token")
	}
	wire[12]++ // change the world size
	tampered, err := readHello(bytes.NewReader(wire), kindHello)
	if err != nil {
		t.Fatal(err)
	}
	if key.Verify(tokenauth.Dialer, tampered.data, ch.data, mac, tampered.body(), ch.body()) {
		t.Fatal("a proof verified over a tampered hello")
	}
	wire[4] = 3
	if _, err := readHello(bytes.NewReader(wire), kindHello); !errors.Is(err, errVersion) || !errors.Is(err, transport.ErrMismatch) {
		t.Fatalf("version 3: want errVersion and ErrMismatch, got %v", err)
	}
	wire[0] = 'X'
	if _, err := readHello(bytes.NewReader(wire), kindHello); !errors.Is(err, transport.ErrMismatch) {
		t.Fatalf("bad magic: want ErrMismatch, got %v", err)
	}
}

func FuzzReadHello(f *testing.F) {
	h := hello{kind: kindHello, rank: 1, size: 2}
	h.data, _ = tokenauth.NewNonce()
	var buf bytes.Buffer
	writeHello(&buf, &h)
	f.Add(buf.Bytes())
	f.Add([]byte("TNDM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := readHello(bytes.NewReader(b), kindHello)
		if err != nil {
			return
		}
		var out bytes.Buffer
		writeHello(&out, got)
		if !bytes.Equal(out.Bytes()[:7], b[:7]) || !bytes.Equal(out.Bytes()[8:], b[8:helloSize]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
