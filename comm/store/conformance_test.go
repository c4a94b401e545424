package store_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/storetest"
)

// The Store contract, checked by storetest on every kind this package has.

func quiet() store.Option { return store.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) }

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		m := store.NewMemory()
		t.Cleanup(func() { m.Close() })
		return func() store.Store { return m }
	})
}

func TestPrefixConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		m := store.NewMemory()
		t.Cleanup(func() { m.Close() })
		return func() store.Store {
			p := store.NewPrefix("job", m)
			t.Cleanup(func() { p.Close() })
			return p
		}
	})
}

func TestFileConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		path := filepath.Join(t.TempDir(), "store")
		return func() store.Store {
			s, err := store.NewFile(path, store.WithPollInterval(5*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	})
}

// TestTCPConformance runs a server on its own (as `tandem store` does) and
// dials a client per handle.
func TestTCPConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		srv, err := store.NewServer("127.0.0.1:0", quiet(), store.WithToken(""))
		if err != nil {
			t.Fatal(err)
		}
		storetest.Serve(t, srv)
		return func() store.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := store.Dial(ctx, srv.Addr(), quiet(), store.WithToken(""))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	})
}

// TestNewTCPConformance checks NewTCP, c10d's TCPStore: the first handle is
// the master, which embeds the server; the others dial it with a token.
func TestNewTCPConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		t.Cleanup(cancel)
		master, err := store.NewTCP(ctx, "127.0.0.1:0", true, quiet(), store.WithToken("secret"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { master.Close() })
		first := true
		return func() store.Store {
			if first {
				first = false
				return master
			}
			s, err := store.NewTCP(ctx, master.Addr(), false, quiet(), store.WithToken("secret"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	})
}
