package torchstore

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/storetest"
)

// long bounds calls that must succeed.
const long = 20 * time.Second

// startServer runs a server on a loopback port until the test ends.
func startServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{Unauthenticated(), WithLogger(quietLogger(t))}, opts...)
	srv, err := NewServer("", opts...)
	noErr(t, err)
	storetest.Serve(t, srv)
	return srv
}

// quietLogger logs to the test's output.
func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(b, "\n")))
	return len(b), nil
}

func dialT(t *testing.T, srv *Server, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(ctxFor(t, long), srv.Addr(), append([]Option{WithLogger(quietLogger(t))}, opts...)...)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConformance checks the Store contract on a Go client and a Go server,
// without Python, as far as torch 1.13's protocol goes: it has no APPEND, so
// Append is refused.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() store.Store {
		srv := startServer(t)
		return func() store.Store { return dialT(t, srv) }
	}, storetest.WithoutAppend())
}
