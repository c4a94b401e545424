package tcp

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
)

// loopback is the backend every test uses: 127.0.0.1 only.
var loopback = NewBackend(WithHost("127.0.0.1"))

// streamOnly is loopback without single-copy transfers: every byte goes
// through the socket.
var streamOnly = NewBackend(WithHost("127.0.0.1"), WithSameHostCopy(false))

// dataPaths are the two ways large messages travel between local ranks.
var dataPaths = []struct {
	name    string
	backend Backend
}{{"single-copy", loopback}, {"stream", streamOnly}}

// connectAll builds a world of n transports over one in-memory store, each
// rank connecting from its own goroutine. The transports are closed at the
// end of the test.
func connectAll(t testing.TB, n int, mutate func(rank int, cfg *transport.Config)) []*Transport {
	t.Helper()
	return connectAllWith(t, func(int) Backend { return loopback }, n, mutate)
}

// connectAllWith is connectAll with rank r connecting through backend(r).
func connectAllWith(t testing.TB, backend func(rank int) Backend, n int, mutate func(rank int, cfg *transport.Config)) []*Transport {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ts, errs := connectWorldWith(backend, n, st, mutate)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: connect: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	return ts
}

func newStore(t testing.TB) *store.Memory {
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	return st
}

// connectWorld connects n ranks concurrently and returns what each got.
func connectWorld(n int, st store.Store, mutate func(rank int, cfg *transport.Config)) ([]*Transport, []error) {
	return connectWorldWith(func(int) Backend { return loopback }, n, st, mutate)
}

func connectWorldWith(backend func(rank int) Backend, n int, st store.Store, mutate func(rank int, cfg *transport.Config)) ([]*Transport, []error) {
	ts := make([]*Transport, n)
	errs := testkit.EachRank(n, func(r int) (err error) {
		cfg := transport.Config{Rank: r, Size: n, Store: st, Timeout: 20 * time.Second, Token: "secret"}
		if mutate != nil {
			mutate(r, &cfg)
		}
		ts[r], err = backend(r).ConnectTCP(context.Background(), cfg)
		return err
	})
	return ts, errs
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// openFDs counts this process's open file descriptors (Linux only; -1 elsewhere).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// settle waits until cond holds or a few seconds pass, and reports whether it held.
func settle(cond func() bool) bool {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error mentioning %q, got nil", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// exchange sends msg from rank src to rank dst of ts under tag and fails the
// test, saying what the exchange was, unless it arrives intact.
func exchange(t *testing.T, ctx context.Context, ts []*Transport, src, dst int, tag transport.Tag, msg []byte, what string) {
	t.Helper()
	if err := ts[src].Send(ctx, dst, tag, msg); err != nil {
		t.Fatalf("%s: send: %v", what, err)
	}
	got := make([]byte, len(msg))
	if err := ts[dst].Recv(ctx, src, tag, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("%s: receive: %v (intact: %v)", what, err, bytes.Equal(got, msg))
	}
}
