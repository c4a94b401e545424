package store

import (
	"context"
	"errors"
	"testing"
)

func TestPrefixNamespaces(t *testing.T) {
	ctx := ctxFor(t, long)
	m := NewMemory()
	defer m.Close()
	a, b := NewPrefix("a", m), NewPrefix("b", m)
	noErr(t, a.Set(ctx, "k", []byte("from a")))
	noErr(t, b.Set(ctx, "k", []byte("from b")))
	if v := must(m.Get(ctx, "a/k")).get(t); string(v) != "from a" {
		t.Fatalf("underlying a/k = %q", v)
	}
	if v := must(b.Get(ctx, "k")).get(t); string(v) != "from b" {
		t.Fatalf("b sees %q", v)
	}
	nested := NewPrefix("inner", a)
	noErr(t, nested.Set(ctx, "x", nil))
	if ok := must(m.Check(ctx, []string{"a/inner/x"})).get(t); !ok {
		t.Fatal("nested prefix did not compose to a/inner/x")
	}
	// NumKeys counts the underlying store's keys, as documented.
	if n := must(a.NumKeys(ctx)).get(t); n != 3 {
		t.Fatalf("NumKeys through a prefix = %d, want 3 (every key of the underlying store)", n)
	}
	// Closing a view leaves the underlying store and other views working.
	noErr(t, a.Close())
	if _, err := a.Get(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get on closed prefix: %v", err)
	}
	if v := must(b.Get(ctx, "k")).get(t); string(v) != "from b" {
		t.Fatalf("other view after Close: %q", v)
	}
	must(m.Get(context.Background(), "a/k")).get(t)
}
