package store

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFileSurvivesReopen(t *testing.T) {
	ctx := ctxFor(t, long)
	path := filepath.Join(t.TempDir(), "store")
	a, err := NewFile(path)
	noErr(t, err)
	noErr(t, a.Set(ctx, "k", []byte("v")))
	must(a.Add(ctx, "n", 3)).get(t)
	noErr(t, a.Append(ctx, "log", []byte("ab")))
	must(a.DeleteKey(ctx, "k")).get(t)
	noErr(t, a.Close())
	b, err := NewFile(path)
	noErr(t, err)
	defer b.Close()
	if n := must(b.NumKeys(ctx)).get(t); n != 2 {
		t.Fatalf("NumKeys after reopen = %d, want 2", n)
	}
	if v := must(b.Get(ctx, "log")).get(t); string(v) != "ab" {
		t.Fatalf("log after reopen = %q", v)
	}
}

func TestFileTornRecord(t *testing.T) {
	ctx := ctxFor(t, long)
	path := filepath.Join(t.TempDir(), "store")
	a, err := NewFile(path)
	noErr(t, err)
	defer a.Close()
	noErr(t, a.Set(ctx, "good", []byte("1")))
	// A writer that died half-way through a record.
	rec := appendRecord(nil, recSet, "torn", []byte("value"))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	noErr(t, err)
	_, err = f.Write(rec[:len(rec)-3])
	noErr(t, err)
	noErr(t, f.Close())

	b, err := NewFile(path)
	noErr(t, err)
	defer b.Close()
	if ok := must(b.Check(ctx, []string{"torn"})).get(t); ok {
		t.Fatal("a torn record was applied")
	}
	// The next writer cuts the torn tail off and appends after it.
	noErr(t, b.Set(ctx, "after", []byte("2")))
	for _, s := range []Store{a, b} {
		vs := must(s.MultiGet(ctx, []string{"good", "after"})).get(t)
		if string(vs[0]) != "1" || string(vs[1]) != "2" {
			t.Fatalf("after a torn record: %q", vs)
		}
	}
}

func TestFileRefusesForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notes.txt")
	noErr(t, os.WriteFile(path, []byte("shopping list\n"), 0o600))
	if _, err := NewFile(path); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("NewFile on a foreign file: %v, want ErrInvalidArgument", err)
	}
}
