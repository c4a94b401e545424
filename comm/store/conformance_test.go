package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

// opener makes a fresh backing store for one test and returns a function that
// opens handles on it: every handle sees the same keys (for the in-memory
// store, every handle is the same store). Handles are closed by t.Cleanup.
type opener func(t *testing.T) func() Store

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

// runConformance checks every operation of the Store contract on the stores
// that open makes.
func runConformance(t *testing.T, open opener) {
	tests := []struct {
		name string
		run  func(t *testing.T, open func() Store)
	}{
		{"SetGet", testSetGet},
		{"GetBlocksUntilSet", testGetBlocks},
		{"GetTimeout", testGetTimeout},
		{"GetCancelled", testGetCancelled},
		{"Add", testAdd},
		{"AddConcurrent", testAddConcurrent},
		{"CompareSet", testCompareSet},
		{"DeleteKey", testDeleteKey},
		{"NumKeys", testNumKeys},
		{"Check", testCheck},
		{"Wait", testWait},
		{"MultiSetMultiGet", testMulti},
		{"Append", testAppend},
		{"ManyWaiters", testManyWaiters},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, open(t))
		})
	}
}

func testSetGet(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "a", []byte("one")))
	if v := must(s.Get(ctx, "a")).get(t); string(v) != "one" {
		t.Fatalf("Get(a) = %q, want one", v)
	}
	noErr(t, s.Set(ctx, "a", []byte("two")))
	bin := []byte{0, 1, 2, 255, 0}
	noErr(t, s.Set(ctx, "bin", bin))
	noErr(t, s.Set(ctx, "empty", nil))
	noErr(t, s.Set(ctx, "", []byte("empty key")))
	other := open()
	if v := must(other.Get(ctx, "a")).get(t); string(v) != "two" {
		t.Fatalf("Get(a) after overwrite = %q, want two", v)
	}
	v := must(other.Get(ctx, "bin")).get(t)
	if !bytes.Equal(v, bin) {
		t.Fatalf("Get(bin) = %v, want %v", v, bin)
	}
	v[0] = 42 // the caller owns what Get returns
	if v := must(other.Get(ctx, "bin")).get(t); !bytes.Equal(v, bin) {
		t.Fatalf("mutating a returned value changed the store: %v", v)
	}
	bin[1] = 42 // and the store owns a copy of what Set was given
	if v := must(other.Get(ctx, "bin")).get(t); v[1] != 1 {
		t.Fatalf("mutating a set value changed the store: %v", v)
	}
	if v := must(other.Get(ctx, "empty")).get(t); len(v) != 0 {
		t.Fatalf("Get(empty) = %q", v)
	}
	if v := must(other.Get(ctx, "")).get(t); string(v) != "empty key" {
		t.Fatalf("Get(\"\") = %q", v)
	}
}

func testGetBlocks(t *testing.T, open func() Store) {
	getter, setter := open(), open()
	ctx := ctxFor(t, long)
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		v, err := getter.Get(ctx, "late")
		errc <- err
		got <- v
	}()
	if ok := must(setter.Check(ctx, []string{"late"})).get(t); ok {
		t.Fatal("key exists before Set")
	}
	time.Sleep(20 * time.Millisecond) // let the getter block (the test passes either way)
	noErr(t, setter.Set(ctx, "late", []byte("here")))
	noErr(t, <-errc)
	if v := <-got; string(v) != "here" {
		t.Fatalf("blocked Get returned %q", v)
	}
}

func testGetTimeout(t *testing.T, open func() Store) {
	s := open()
	ctx, cancel := context.WithTimeout(context.Background(), short)
	defer cancel()
	_, err := s.Get(ctx, "never")
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with expiring context: %v, want ErrTimeout and DeadlineExceeded", err)
	}
	err = s.Wait(ctxFor(t, long), []string{"never"}, short)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait with short timeout: %v, want ErrTimeout", err)
	}
	_, err = s.MultiGet(ctx, []string{"never"})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("MultiGet with expired context: %v, want ErrTimeout", err)
	}
	// The store still works after timeouts.
	noErr(t, s.Set(ctxFor(t, long), "never", []byte("now")))
	noErr(t, s.Wait(ctxFor(t, long), []string{"never"}, 0))
}

func testGetCancelled(t *testing.T, open func() Store) {
	s := open()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("Get with cancelled context: %v, want context.Canceled and not ErrTimeout", err)
	}
}

func testAdd(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	if n := must(s.Add(ctx, "c", 5)).get(t); n != 5 {
		t.Fatalf("Add to missing key = %d, want 5", n)
	}
	if n := must(s.Add(ctx, "c", -7)).get(t); n != -2 {
		t.Fatalf("Add -7 = %d, want -2", n)
	}
	if n := must(s.Add(ctx, "c", 0)).get(t); n != -2 {
		t.Fatalf("Add 0 = %d, want -2", n)
	}
	if v := must(s.Get(ctx, "c")).get(t); string(v) != "-2" {
		t.Fatalf("counter stored as %q, want decimal text -2", v)
	}
	noErr(t, s.Set(ctx, "d", []byte("41")))
	if n := must(s.Add(ctx, "d", 1)).get(t); n != 42 {
		t.Fatalf("Add to set counter = %d, want 42", n)
	}
	noErr(t, s.Set(ctx, "text", []byte("hello")))
	if _, err := s.Add(ctx, "text", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Add to non-integer: %v, want ErrInvalidArgument", err)
	}
	if v := must(s.Get(ctx, "text")).get(t); string(v) != "hello" {
		t.Fatalf("failed Add changed the value to %q", v)
	}
}

func testAddConcurrent(t *testing.T, open func() Store) {
	const workers, each = 8, 25
	ctx := ctxFor(t, long)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	seen := make(chan int64, workers*each)
	for range workers {
		s := open()
		wg.Go(func() {
			for range each {
				n, err := s.Add(ctx, "counter", 1)
				if err != nil {
					errc <- err
					return
				}
				seen <- n
			}
		})
	}
	wg.Wait()
	close(errc)
	close(seen)
	for err := range errc {
		t.Fatal(err)
	}
	distinct := map[int64]bool{}
	for n := range seen {
		if distinct[n] {
			t.Fatalf("two Adds returned %d", n)
		}
		distinct[n] = true
	}
	v := must(open().Get(ctx, "counter")).get(t)
	if string(v) != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d", v, workers*each)
	}
}

func testCompareSet(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	cases := []struct {
		name                  string
		initial               *string // nil: key absent
		expected, desired     string
		want                  string
		after                 *string // nil: key absent afterwards
		expectSetDuringUpdate bool
	}{
		{name: "absent, empty expected: sets", expected: "", desired: "new", want: "new", after: ptr("new")},
		{name: "absent, nonempty expected: returns expected", expected: "old", desired: "new", want: "old"},
		{name: "present, matching: sets", initial: ptr("old"), expected: "old", desired: "new", want: "new", after: ptr("new")},
		{name: "present, not matching: returns current", initial: ptr("cur"), expected: "old", desired: "new", want: "cur", after: ptr("cur")},
		{name: "present, empty expected: returns current", initial: ptr("cur"), expected: "", desired: "new", want: "cur", after: ptr("cur")},
		{name: "present empty, empty expected: sets", initial: ptr(""), expected: "", desired: "new", want: "new", after: ptr("new")},
	}
	for i, c := range cases {
		key := fmt.Sprintf("cas%d", i)
		if c.initial != nil {
			noErr(t, s.Set(ctx, key, []byte(*c.initial)))
		}
		got, err := s.CompareSet(ctx, key, []byte(c.expected), []byte(c.desired))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(got) != c.want {
			t.Errorf("%s: CompareSet returned %q, want %q", c.name, got, c.want)
		}
		ok := must(s.Check(ctx, []string{key})).get(t)
		switch {
		case c.after == nil && ok:
			t.Errorf("%s: key exists afterwards", c.name)
		case c.after != nil && !ok:
			t.Errorf("%s: key absent afterwards", c.name)
		case c.after != nil:
			if v := must(s.Get(ctx, key)).get(t); string(v) != *c.after {
				t.Errorf("%s: value afterwards %q, want %q", c.name, v, *c.after)
			}
		}
	}
	// A CompareSet that creates a key wakes a Get blocked on it.
	other := open()
	done := make(chan error, 1)
	go func() {
		_, err := other.Get(ctx, "cas-wake")
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	must(s.CompareSet(ctx, "cas-wake", nil, []byte("x"))).get(t)
	noErr(t, <-done)
}

func ptr(s string) *string { return &s }

func testDeleteKey(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "k", []byte("v")))
	if ok := must(s.DeleteKey(ctx, "k")).get(t); !ok {
		t.Fatal("DeleteKey of a present key reported false")
	}
	if ok := must(s.DeleteKey(ctx, "k")).get(t); ok {
		t.Fatal("DeleteKey of an absent key reported true")
	}
	if ok := must(s.Check(ctx, []string{"k"})).get(t); ok {
		t.Fatal("deleted key still exists")
	}
	sctx, cancel := context.WithTimeout(ctx, short)
	defer cancel()
	if _, err := s.Get(sctx, "k"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get of deleted key: %v, want ErrTimeout", err)
	}
	if n := must(s.Add(ctx, "k", 3)).get(t); n != 3 {
		t.Fatalf("Add after delete = %d, want 3", n)
	}
}

func testNumKeys(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	base := must(s.NumKeys(ctx)).get(t)
	noErr(t, s.Set(ctx, "n1", []byte("a")))
	noErr(t, s.Set(ctx, "n1", []byte("b")))
	must(s.Add(ctx, "n2", 1)).get(t)
	noErr(t, s.Append(ctx, "n3", []byte("x")))
	if n := must(s.NumKeys(ctx)).get(t); n != base+3 {
		t.Fatalf("NumKeys = %d, want %d", n, base+3)
	}
	must(s.DeleteKey(ctx, "n2")).get(t)
	if n := must(s.NumKeys(ctx)).get(t); n != base+2 {
		t.Fatalf("NumKeys after delete = %d, want %d", n, base+2)
	}
}

func testCheck(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "x", nil))
	noErr(t, s.Set(ctx, "y", []byte("1")))
	for _, c := range []struct {
		keys []string
		want bool
	}{
		{nil, true},
		{[]string{"x"}, true},
		{[]string{"x", "y"}, true},
		{[]string{"x", "z"}, false},
		{[]string{"z"}, false},
	} {
		if got := must(s.Check(ctx, c.keys)).get(t); got != c.want {
			t.Errorf("Check(%q) = %v, want %v", c.keys, got, c.want)
		}
	}
}

func testWait(t *testing.T, open func() Store) {
	waiter, setter := open(), open()
	ctx := ctxFor(t, long)
	noErr(t, waiter.Wait(ctx, nil, short))
	noErr(t, setter.Set(ctx, "w1", nil))
	done := make(chan error, 1)
	go func() { done <- waiter.Wait(ctx, []string{"w1", "w2", "w3", "w2"}, 0) }()
	time.Sleep(10 * time.Millisecond)
	noErr(t, setter.Set(ctx, "w2", []byte("a")))
	must(setter.Add(ctx, "w3", 1)).get(t)
	noErr(t, <-done)
	if err := waiter.Wait(ctx, []string{"w1", "absent"}, short); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait for an absent key: %v, want ErrTimeout", err)
	}
}

func testMulti(t *testing.T, open func() Store) {
	s, other := open(), open()
	ctx := ctxFor(t, long)
	noErr(t, s.MultiSet(ctx, []string{"m1", "m2"}, [][]byte{[]byte("a"), {}}))
	vs := must(other.MultiGet(ctx, []string{"m2", "m1"})).get(t)
	if len(vs) != 2 || string(vs[0]) != "" || string(vs[1]) != "a" {
		t.Fatalf("MultiGet = %q", vs)
	}
	if err := s.MultiSet(ctx, []string{"a", "b"}, [][]byte{nil}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("MultiSet with mismatched lengths: %v, want ErrInvalidArgument", err)
	}
	if ok := must(s.Check(ctx, []string{"a"})).get(t); ok {
		t.Fatal("refused MultiSet stored a key")
	}
	if vs := must(other.MultiGet(ctx, nil)).get(t); len(vs) != 0 {
		t.Fatalf("MultiGet(nil) = %q", vs)
	}
	got := make(chan [][]byte, 1)
	errc := make(chan error, 1)
	go func() {
		vs, err := other.MultiGet(ctx, []string{"m1", "m3"})
		errc <- err
		got <- vs
	}()
	time.Sleep(10 * time.Millisecond)
	noErr(t, s.MultiSet(ctx, []string{"m3"}, [][]byte{[]byte("c")}))
	noErr(t, <-errc)
	if vs := <-got; string(vs[0]) != "a" || string(vs[1]) != "c" {
		t.Fatalf("blocked MultiGet = %q", vs)
	}
}

func testAppend(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Append(ctx, "log", []byte("ab")))
	noErr(t, s.Append(ctx, "log", []byte("cd")))
	noErr(t, s.Append(ctx, "log", nil))
	if v := must(s.Get(ctx, "log")).get(t); string(v) != "abcd" {
		t.Fatalf("Append result %q, want abcd", v)
	}
	noErr(t, s.Append(ctx, "nothing", nil))
	if ok := must(s.Check(ctx, []string{"nothing"})).get(t); !ok {
		t.Fatal("Append of nothing did not create the key")
	}
	// Appends from several handles all land.
	var wg sync.WaitGroup
	for i := range 4 {
		h := open()
		wg.Go(func() {
			for range 10 {
				if err := h.Append(ctx, "shared", []byte{byte('a' + i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	v := must(s.Get(ctx, "shared")).get(t)
	if len(v) != 40 {
		t.Fatalf("concurrent Appends produced %d bytes, want 40", len(v))
	}
	for i := range 4 {
		if n := bytes.Count(v, []byte{byte('a' + i)}); n != 10 {
			t.Fatalf("appender %d landed %d times, want 10", i, n)
		}
	}
}

func testManyWaiters(t *testing.T, open func() Store) {
	const n = 32
	s := open()
	ctx := ctxFor(t, long)
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			v, err := s.Get(ctx, "go")
			if err == nil && string(v) != "now" {
				err = fmt.Errorf("waiter %d got %q", i, v)
			}
			errc <- err
		})
	}
	time.Sleep(20 * time.Millisecond)
	noErr(t, open().Set(ctx, "go", []byte("now")))
	wg.Wait()
	close(errc)
	for err := range errc {
		noErr(t, err)
	}
}

func testClose(t *testing.T, open func() Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "k", []byte("v")))
	blocked := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, "never")
		blocked <- err
	}()
	time.Sleep(20 * time.Millisecond)
	noErr(t, s.Close())
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("Get blocked across Close: %v, want ErrClosed", err)
	}
	if err := s.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Add(ctx, "c", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
	_ = s.Close() // a second Close is harmless
}
