// Package storetest checks implementations of store.Store against the
// contract that comm/store documents, in the manner of testing/fstest: a
// store package (or a new backend) proves itself by calling Run from its
// tests.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) func() store.Store {
//			srv := startServer(t) // a fresh backing store for this case
//			return func() store.Store { return dial(t, srv) }
//		})
//	}
//
// Run runs one subtest per operation of the contract (Set and Get, blocking
// Get, timeouts, cancellation, Add, CompareSet, DeleteKey, NumKeys, Check,
// Wait, MultiSet and MultiGet, Append, many waiters, Close). Each subtest
// asks the Opener for a fresh backing store, then opens as many handles on
// it as it needs. Options describe what a store cannot do (WithoutAppend),
// and the suite checks that it refuses those calls as documented. Serve
// runs a store server for the length of a test.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// Opener makes a fresh backing store for one subtest and returns a function
// that opens handles on it: every handle sees the same keys (a store with no
// notion of a connection, such as store.Memory, may return the same value
// each time). The Opener closes what it made when the subtest ends (with
// t.Cleanup); the suite closes handles itself only where it tests Close, and
// a second Close must be harmless.
type Opener func(t *testing.T) func() store.Store

// Option describes a store that departs from the full contract in a
// documented way.
type Option func(*config)

type config struct {
	noAppend bool
}

// WithoutAppend says that the store has no Append (torch 1.13's protocol
// has none): Append must fail with an error wrapping both
// errors.ErrUnsupported and store.ErrInvalidArgument and change nothing, and
// the other cases do not use it.
func WithoutAppend() Option { return func(c *config) { c.noAppend = true } }

// Server is a store server, such as a *store.Server or a
// *torchstore.Server: Serve serves until Close.
type Server interface {
	Serve(ctx context.Context) error
	Close() error
}

// Serve runs srv until the test ends, then closes it and fails the test if
// Serve returned an error.
func Serve(t testing.TB, srv Server) {
	t.Helper()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// short bounds calls that must give up; long bounds calls that must succeed.
const (
	short = 100 * time.Millisecond
	long  = 20 * time.Second
)

// Run checks every operation of the Store contract on the stores that open
// makes, one subtest each.
func Run(t *testing.T, open Opener, opts ...Option) {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	appendCase := testAppend
	if cfg.noAppend {
		appendCase = testAppendRefused
	}
	tests := []struct {
		name string
		run  func(t *testing.T, cfg config, open func() store.Store)
	}{
		{"SetGet", testSetGet},
		{"GetBlocksUntilSet", testGetBlocks},
		{"GetTimeout", testGetTimeout},
		{"GetCancelled", testGetCancelled},
		{"ContextRule", testContextRule},
		{"Add", testAdd},
		{"AddConcurrent", testAddConcurrent},
		{"CompareSet", testCompareSet},
		{"DeleteKey", testDeleteKey},
		{"NumKeys", testNumKeys},
		{"Check", testCheck},
		{"Wait", testWait},
		{"MultiSetMultiGet", testMulti},
		{"Append", appendCase},
		{"ManyWaiters", testManyWaiters},
		{"Close", testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, cfg, open(t))
		})
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// get returns key's value, failing the test on an error.
func get(t *testing.T, ctx context.Context, s store.Store, key string) []byte {
	t.Helper()
	v, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return v
}

// add returns the counter after Add, failing the test on an error.
func add(t *testing.T, ctx context.Context, s store.Store, key string, delta int64) int64 {
	t.Helper()
	n, err := s.Add(ctx, key, delta)
	if err != nil {
		t.Fatalf("Add(%q, %d): %v", key, delta, err)
	}
	return n
}

// check reports whether all keys exist, failing the test on an error.
func check(t *testing.T, ctx context.Context, s store.Store, keys ...string) bool {
	t.Helper()
	ok, err := s.Check(ctx, keys)
	if err != nil {
		t.Fatalf("Check(%q): %v", keys, err)
	}
	return ok
}

// numKeys returns NumKeys, failing the test on an error.
func numKeys(t *testing.T, ctx context.Context, s store.Store) int64 {
	t.Helper()
	n, err := s.NumKeys(ctx)
	if err != nil {
		t.Fatalf("NumKeys: %v", err)
	}
	return n
}

// deleteKey returns DeleteKey's report, failing the test on an error.
func deleteKey(t *testing.T, ctx context.Context, s store.Store, key string) bool {
	t.Helper()
	ok, err := s.DeleteKey(ctx, key)
	if err != nil {
		t.Fatalf("DeleteKey(%q): %v", key, err)
	}
	return ok
}

// compareSet returns CompareSet's value, failing the test on an error.
func compareSet(t *testing.T, ctx context.Context, s store.Store, key string, expected, desired []byte) []byte {
	t.Helper()
	v, err := s.CompareSet(ctx, key, expected, desired)
	if err != nil {
		t.Fatalf("CompareSet(%q): %v", key, err)
	}
	return v
}

func testSetGet(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "a", []byte("one")))
	if v := get(t, ctx, s, "a"); string(v) != "one" {
		t.Fatalf("Get(a) = %q, want one", v)
	}
	noErr(t, s.Set(ctx, "a", []byte("two")))
	bin := []byte{0, 1, 2, 255, 0}
	noErr(t, s.Set(ctx, "bin", bin))
	noErr(t, s.Set(ctx, "empty", nil))
	noErr(t, s.Set(ctx, "", []byte("empty key")))
	other := open()
	if v := get(t, ctx, other, "a"); string(v) != "two" {
		t.Fatalf("Get(a) after overwrite = %q, want two", v)
	}
	v := get(t, ctx, other, "bin")
	if !bytes.Equal(v, bin) {
		t.Fatalf("Get(bin) = %v, want %v", v, bin)
	}
	v[0] = 42 // the caller owns what Get returns
	if v := get(t, ctx, other, "bin"); !bytes.Equal(v, bin) {
		t.Fatalf("mutating a returned value changed the store: %v", v)
	}
	bin[1] = 42 // and the store owns a copy of what Set was given
	if v := get(t, ctx, other, "bin"); v[1] != 1 {
		t.Fatalf("mutating a set value changed the store: %v", v)
	}
	if v := get(t, ctx, other, "empty"); len(v) != 0 {
		t.Fatalf("Get(empty) = %q", v)
	}
	if v := get(t, ctx, other, ""); string(v) != "empty key" {
		t.Fatalf("Get(\"\") = %q", v)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: many reads on a connection
	noErr(t, s.Set(ctx, "big", big))
	if v := get(t, ctx, other, "big"); !bytes.Equal(v, big) {
		t.Fatalf("Get(big): %d bytes, not the %d set", len(v), len(big))
	}
}

func testGetBlocks(t *testing.T, _ config, open func() store.Store) {
	getter, setter := open(), open()
	ctx := ctxFor(t, long)
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		v, err := getter.Get(ctx, "late")
		errc <- err
		got <- v
	}()
	if check(t, ctx, setter, "late") {
		t.Fatal("key exists before Set")
	}
	time.Sleep(20 * time.Millisecond) // let the getter block (the test passes either way)
	// The same handle serves other calls while its Get blocks.
	noErr(t, getter.Set(ctx, "other", []byte("x")))
	noErr(t, setter.Set(ctx, "late", []byte("here")))
	noErr(t, <-errc)
	if v := <-got; string(v) != "here" {
		t.Fatalf("blocked Get returned %q", v)
	}
}

func testGetTimeout(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx, cancel := context.WithTimeout(context.Background(), short)
	defer cancel()
	_, err := s.Get(ctx, "never")
	if !errors.Is(err, store.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with expiring context: %v, want ErrTimeout and DeadlineExceeded", err)
	}
	err = s.Wait(ctxFor(t, long), []string{"never"}, short)
	if !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Wait with short timeout: %v, want ErrTimeout", err)
	}
	_, err = s.MultiGet(ctx, []string{"never"})
	if !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("MultiGet with expired context: %v, want ErrTimeout", err)
	}
	// The store still works after timeouts, and requests left in flight
	// (on a server) do not answer later calls.
	noErr(t, s.Set(ctxFor(t, long), "never", []byte("now")))
	noErr(t, s.Wait(ctxFor(t, long), []string{"never"}, 0))
	for i := range 5 {
		if n := add(t, ctxFor(t, long), s, "after", 1); n != int64(i+1) {
			t.Fatalf("Add after timeouts = %d, want %d", n, i+1)
		}
	}
}

func testGetCancelled(t *testing.T, _ config, open func() store.Store) {
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
	if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Get with cancelled context: %v, want context.Canceled and not ErrTimeout", err)
	}
	noErr(t, s.Set(ctxFor(t, long), "k", nil)) // and the store still works
}

// testContextRule checks the rule every store keeps, for blocking and
// non-blocking calls: a deadline gives ErrTimeout and
// context.DeadlineExceeded, a cancellation context.Canceled and not
// ErrTimeout, a nil context ErrInvalidArgument.
func testContextRule(t *testing.T, _ config, open func() store.Store) {
	s := open()
	expired := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Errorf("%s after a deadline: %v, want ErrTimeout and context.DeadlineExceeded", what, err)
		}
	}
	cancelled := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) || errors.Is(err, store.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s after a cancellation: %v, want context.Canceled and not ErrTimeout", what, err)
		}
	}
	// Blocking calls, ended while they wait.
	dctx, dcancel := context.WithTimeout(context.Background(), short)
	defer dcancel()
	expired("Wait", s.Wait(dctx, []string{"never"}, 0))
	cctx, ccancel := context.WithCancel(context.Background())
	timer := time.AfterFunc(short, ccancel)
	defer timer.Stop()
	cancelled("Wait", s.Wait(cctx, []string{"never"}, long))
	// Calls whose context ended before they started.
	gone, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	expired("Set", s.Set(gone, "k", []byte("v")))
	_, err := s.Add(gone, "n", 1)
	expired("Add", err)
	dead, cancelDead := context.WithCancel(context.Background())
	cancelDead()
	cancelled("Set", s.Set(dead, "k", []byte("v")))
	_, err = s.MultiGet(dead, []string{"never"})
	cancelled("MultiGet", err)
	// A nil context is a programming error: refused, not a panic.
	var none context.Context
	if err := s.Set(none, "k", []byte("v")); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("Set with a nil context: %v, want ErrInvalidArgument", err)
	}
	if _, err := s.Get(none, "k"); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("Get with a nil context: %v, want ErrInvalidArgument", err)
	}
	if err := s.Wait(none, []string{"k"}, short); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("Wait with a nil context: %v, want ErrInvalidArgument", err)
	}
	// The store still works.
	noErr(t, s.Set(ctxFor(t, long), "k", []byte("v")))
	if v := get(t, ctxFor(t, long), s, "k"); string(v) != "v" {
		t.Fatalf("Get after the context cases = %q, want \"v\"", v)
	}
}

func testAdd(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	if n := add(t, ctx, s, "c", 5); n != 5 {
		t.Fatalf("Add to missing key = %d, want 5", n)
	}
	if n := add(t, ctx, s, "c", -7); n != -2 {
		t.Fatalf("Add -7 = %d, want -2", n)
	}
	if n := add(t, ctx, s, "c", 0); n != -2 {
		t.Fatalf("Add 0 = %d, want -2", n)
	}
	if v := get(t, ctx, s, "c"); string(v) != "-2" {
		t.Fatalf("counter stored as %q, want decimal text -2", v)
	}
	noErr(t, s.Set(ctx, "d", []byte("41")))
	if n := add(t, ctx, s, "d", 1); n != 42 {
		t.Fatalf("Add to set counter = %d, want 42", n)
	}
	noErr(t, s.Set(ctx, "text", []byte("hello")))
	if _, err := s.Add(ctx, "text", 1); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Add to non-integer: %v, want ErrInvalidArgument", err)
	}
	if v := get(t, ctx, s, "text"); string(v) != "hello" {
		t.Fatalf("failed Add changed the value to %q", v)
	}
	noErr(t, s.Set(ctx, "max", []byte(strconv.FormatInt(1<<63-1, 10))))
	if _, err := s.Add(ctx, "max", 1); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Add overflowing int64: %v, want ErrInvalidArgument", err)
	}
}

func testAddConcurrent(t *testing.T, _ config, open func() store.Store) {
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
	if v := get(t, ctx, open(), "counter"); string(v) != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d", v, workers*each)
	}
}

func testCompareSet(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	ptr := func(s string) *string { return &s }
	cases := []struct {
		name              string
		initial           *string // nil: key absent
		expected, desired string
		want              string
		after             *string // nil: key absent afterwards
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
		ok := check(t, ctx, s, key)
		switch {
		case c.after == nil && ok:
			t.Errorf("%s: key exists afterwards", c.name)
		case c.after != nil && !ok:
			t.Errorf("%s: key absent afterwards", c.name)
		case c.after != nil:
			if v := get(t, ctx, s, key); string(v) != *c.after {
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
	compareSet(t, ctx, s, "cas-wake", nil, []byte("x"))
	noErr(t, <-done)
}

func testDeleteKey(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "k", []byte("v")))
	if !deleteKey(t, ctx, s, "k") {
		t.Fatal("DeleteKey of a present key reported false")
	}
	if deleteKey(t, ctx, s, "k") {
		t.Fatal("DeleteKey of an absent key reported true")
	}
	if check(t, ctx, s, "k") {
		t.Fatal("deleted key still exists")
	}
	sctx, cancel := context.WithTimeout(ctx, short)
	defer cancel()
	if _, err := s.Get(sctx, "k"); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Get of deleted key: %v, want ErrTimeout", err)
	}
	if n := add(t, ctx, s, "k", 3); n != 3 {
		t.Fatalf("Add after delete = %d, want 3", n)
	}
}

func testNumKeys(t *testing.T, cfg config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	base := numKeys(t, ctx, s)
	noErr(t, s.Set(ctx, "n1", []byte("a")))
	noErr(t, s.Set(ctx, "n1", []byte("b")))
	add(t, ctx, s, "n2", 1)
	compareSet(t, ctx, s, "n3", nil, []byte("x"))
	want := base + 3
	if !cfg.noAppend {
		noErr(t, s.Append(ctx, "n4", []byte("x")))
		want++
	}
	if n := numKeys(t, ctx, s); n != want {
		t.Fatalf("NumKeys = %d, want %d", n, want)
	}
	deleteKey(t, ctx, s, "n2")
	if n := numKeys(t, ctx, s); n != want-1 {
		t.Fatalf("NumKeys after delete = %d, want %d", n, want-1)
	}
}

func testCheck(t *testing.T, _ config, open func() store.Store) {
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
		if got := check(t, ctx, s, c.keys...); got != c.want {
			t.Errorf("Check(%q) = %v, want %v", c.keys, got, c.want)
		}
	}
}

func testWait(t *testing.T, _ config, open func() store.Store) {
	waiter, setter := open(), open()
	ctx := ctxFor(t, long)
	noErr(t, waiter.Wait(ctx, nil, short))
	noErr(t, setter.Set(ctx, "w1", nil))
	done := make(chan error, 1)
	go func() { done <- waiter.Wait(ctx, []string{"w1", "w2", "w3", "w2"}, 0) }()
	time.Sleep(10 * time.Millisecond)
	noErr(t, setter.Set(ctx, "w2", []byte("a")))
	add(t, ctx, setter, "w3", 1)
	noErr(t, <-done)
	if err := waiter.Wait(ctx, []string{"w1", "absent"}, short); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Wait for an absent key: %v, want ErrTimeout", err)
	}
}

func testMulti(t *testing.T, _ config, open func() store.Store) {
	s, other := open(), open()
	ctx := ctxFor(t, long)
	noErr(t, s.MultiSet(ctx, []string{"m1", "m2"}, [][]byte{[]byte("a"), {}}))
	vs, err := other.MultiGet(ctx, []string{"m2", "m1"})
	noErr(t, err)
	if len(vs) != 2 || string(vs[0]) != "" || string(vs[1]) != "a" {
		t.Fatalf("MultiGet = %q", vs)
	}
	if err := s.MultiSet(ctx, []string{"a", "b"}, [][]byte{nil}); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("MultiSet with mismatched lengths: %v, want ErrInvalidArgument", err)
	}
	if check(t, ctx, s, "a") {
		t.Fatal("refused MultiSet stored a key")
	}
	if vs, err := other.MultiGet(ctx, nil); err != nil || len(vs) != 0 {
		t.Fatalf("MultiGet(nil) = %q, %v", vs, err)
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

func testAppend(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Append(ctx, "log", []byte("ab")))
	noErr(t, s.Append(ctx, "log", []byte("cd")))
	noErr(t, s.Append(ctx, "log", nil))
	if v := get(t, ctx, s, "log"); string(v) != "abcd" {
		t.Fatalf("Append result %q, want abcd", v)
	}
	noErr(t, s.Append(ctx, "nothing", nil))
	if !check(t, ctx, s, "nothing") {
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
	v := get(t, ctx, s, "shared")
	if len(v) != 40 {
		t.Fatalf("concurrent Appends produced %d bytes, want 40", len(v))
	}
	for i := range 4 {
		if n := bytes.Count(v, []byte{byte('a' + i)}); n != 10 {
			t.Fatalf("appender %d landed %d times, want 10", i, n)
		}
	}
}

// testAppendRefused checks a store without Append (WithoutAppend): it says
// so and changes nothing.
func testAppendRefused(t *testing.T, _ config, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	err := s.Append(ctx, "log", []byte("ab"))
	if !errors.Is(err, errors.ErrUnsupported) || !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Append: %v, want ErrUnsupported and ErrInvalidArgument", err)
	}
	if check(t, ctx, s, "log") {
		t.Fatal("a refused Append created the key")
	}
}

func testManyWaiters(t *testing.T, _ config, open func() store.Store) {
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

func testClose(t *testing.T, _ config, open func() store.Store) {
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
	if err := <-blocked; !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get blocked across Close: %v, want ErrClosed", err)
	}
	if err := s.Set(ctx, "k", nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Set after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Add(ctx, "c", 1); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
	// ErrClosed, not ErrUnsupported, even from a store without Append.
	if err := s.Append(ctx, "c", nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}
	_ = s.Close() // a second Close is harmless
}
