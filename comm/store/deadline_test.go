package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testkit"
)

// TestContextDeadlineGovernsBlockingCalls: a Get, MultiGet or Wait whose
// context allows longer than the store's default timeout waits the caller's
// time, for every kind of store; without a deadline the default applies.
func TestContextDeadlineGovernsBlockingCalls(t *testing.T) {
	const def = 200 * time.Millisecond
	kinds := map[string]func(t *testing.T) (Store, Store){
		"memory": func(t *testing.T) (Store, Store) {
			m := NewMemory(WithTimeout(def))
			t.Cleanup(func() { m.Close() })
			return m, m
		},
		"file": func(t *testing.T) (Store, Store) {
			path := filepath.Join(t.TempDir(), "store")
			f, err := NewFile(path, WithTimeout(def), WithPollInterval(5*time.Millisecond))
			noErr(t, err)
			g, err := NewFile(path)
			noErr(t, err)
			t.Cleanup(func() { f.Close(); g.Close() })
			return f, g
		},
		"tcp": func(t *testing.T) (Store, Store) {
			srv := startServer(t)
			return dialT(t, srv.Addr(), WithTimeout(def)), dialT(t, srv.Addr())
		},
	}
	for name, open := range kinds {
		t.Run(name, func(t *testing.T) {
			s, other := open(t)
			calls := map[string]func(ctx context.Context, key string) error{
				"get":      func(ctx context.Context, k string) error { _, err := s.Get(ctx, k); return err },
				"multiget": func(ctx context.Context, k string) error { _, err := s.MultiGet(ctx, []string{k}); return err },
				"wait":     func(ctx context.Context, k string) error { return s.Wait(ctx, []string{k}, 0) },
			}
			for op, call := range calls {
				key := name + "/" + op
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				go func() {
					time.Sleep(4 * def)
					other.Set(context.Background(), key, []byte("late"))
				}()
				start := time.Now()
				err := call(ctx, key)
				cancel()
				if err != nil {
					t.Fatalf("%s with a 10s context on a store whose default is %v: %v after %v", op, def, err, time.Since(start))
				}
				if d := time.Since(start); d < 3*def {
					t.Fatalf("%s returned after %v, before the key was set", op, d)
				}
				// Without a deadline the store's default bounds the call.
				start = time.Now()
				err = call(context.Background(), key+"/never")
				if d := time.Since(start); !errors.Is(err, ErrTimeout) || d < def*3/4 || d > def+5*time.Second {
					t.Fatalf("%s without a deadline: %v after %v, want ErrTimeout after about %v", op, err, d, def)
				}
			}
			// Wait's own timeout still bounds it under a longer context.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			if err := s.Wait(ctx, []string{name + "/none"}, 50*time.Millisecond); !errors.Is(err, ErrTimeout) || time.Since(start) > 5*time.Second {
				t.Fatalf("Wait with its own 50ms timeout: %v after %v", err, time.Since(start))
			}
		})
	}
}

// TestClientGivesUpOnGoneServer: when the server's process is gone, its
// address refusing connections, a client that was connected stops
// redialling after GoneAfter and says so, whatever its call's deadline.
func TestClientGivesUpOnGoneServer(t *testing.T) {
	testkit.CheckLeaks(t)
	srv, err := NewServer("127.0.0.1:0", WithLogger(quietLogger()), WithToken(""))
	noErr(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	c := dialT(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noErr(t, c.Set(ctx, "k", []byte("v")))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	noErr(t, srv.Close())
	noErr(t, <-served)
	err = <-errc
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "is gone") ||
		!strings.Contains(err.Error(), "refused since") || !strings.Contains(err.Error(), srv.Addr()) {
		t.Fatalf("Get on a server that is gone: %v, want ErrPeerLost saying the server at %s is gone", err, srv.Addr())
	}
	if took < GoneAfter-time.Second || took > GoneAfter+4*time.Second {
		t.Fatalf("the client gave up after %v, want about %v", took, GoneAfter)
	}
	// Later calls fail at once: the address still refuses.
	start = time.Now()
	if err := c.Set(ctx, "k2", nil); !errors.Is(err, ErrPeerLost) || time.Since(start) > time.Second {
		t.Fatalf("Set after the server was found gone: %v after %v", err, time.Since(start))
	}
	noErr(t, c.Close())
}
