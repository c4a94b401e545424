package store

import (
	"context"
	"testing"
	"time"
)

// short bounds calls that must give up; long bounds calls that must succeed.
const (
	short = 100 * time.Millisecond
	long  = 20 * time.Second
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// must pairs a call's results for checking: must(s.Get(ctx, k)).get(t).
func must[T any](v T, err error) result[T] { return result[T]{v, err} }

type result[T any] struct {
	v   T
	err error
}

// get returns the value, failing the test on an error.
func (r result[T]) get(t *testing.T) T {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
