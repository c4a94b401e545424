package torchstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// The Store contract checked on a Go client and a Go server, without Python.
// comm/store's conformance suite lives in a _test.go file of package store
// and cannot be imported from here, so its cases are repeated, adapted to
// what torch 1.13's protocol can do (Append is refused).

const (
	short = 100 * time.Millisecond
	long  = 20 * time.Second
)

// startServer runs a server on a loopback port until the test ends.
func startServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	opts = append([]Option{Unauthenticated(), WithLogger(quietLogger(t))}, opts...)
	srv, err := NewServer("", opts...)
	noErr(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
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

func TestConformance(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, open func() store.Store)
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
			srv := startServer(t)
			tc.run(t, func() store.Store { return dialT(t, srv) })
		})
	}
}

func testSetGet(t *testing.T, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "a", []byte("one")))
	if v := string(must(s.Get(ctx, "a")).get(t)); v != "one" {
		t.Fatalf("Get(a) = %q, want one", v)
	}
	noErr(t, s.Set(ctx, "a", []byte("two")))
	bin := []byte{0, 1, 2, 255, 0}
	noErr(t, s.Set(ctx, "bin", bin))
	noErr(t, s.Set(ctx, "empty", nil))
	noErr(t, s.Set(ctx, "", []byte("empty key")))
	other := open()
	if v := string(must(other.Get(ctx, "a")).get(t)); v != "two" {
		t.Fatalf("Get(a) after overwrite = %q, want two", v)
	}
	v, err := other.Get(ctx, "bin")
	noErr(t, err)
	if !bytes.Equal(v, bin) {
		t.Fatalf("Get(bin) = %v, want %v", v, bin)
	}
	if v := string(must(other.Get(ctx, "empty")).get(t)); v != "" {
		t.Fatalf("Get(empty) = %q", v)
	}
	if v := string(must(other.Get(ctx, "")).get(t)); v != "empty key" {
		t.Fatalf("Get(\"\") = %q", v)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB, many reads
	noErr(t, s.Set(ctx, "big", big))
	if v, err := other.Get(ctx, "big"); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("Get(big): %d bytes, %v", len(v), err)
	}
}

func testGetBlocks(t *testing.T, open func() store.Store) {
	getter, setter := open(), open()
	ctx := ctxFor(t, long)
	got := make(chan string, 1)
	go func() {
		v, err := getter.Get(ctx, "late")
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(v)
	}()
	if must(setter.Check(ctx, []string{"late"})).get(t) {
		t.Fatal("key exists before Set")
	}
	time.Sleep(20 * time.Millisecond)
	// The same client serves other calls while its Get blocks.
	noErr(t, getter.Set(ctx, "other", []byte("x")))
	noErr(t, setter.Set(ctx, "late", []byte("here")))
	if v := <-got; v != "here" {
		t.Fatalf("blocked Get returned %q", v)
	}
}

func testGetTimeout(t *testing.T, open func() store.Store) {
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
	// The store still works after timeouts, and the WAITs left in flight
	// on the server do not answer later calls.
	noErr(t, s.Set(ctxFor(t, long), "never", []byte("now")))
	noErr(t, s.Wait(ctxFor(t, long), []string{"never"}, 0))
	for i := range 5 {
		if n := must(s.Add(ctxFor(t, long), "after", 1)).get(t); n != int64(i+1) {
			t.Fatalf("Add after timeouts = %d, want %d", n, i+1)
		}
	}
}

func testGetCancelled(t *testing.T, open func() store.Store) {
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
	noErr(t, s.Set(ctxFor(t, long), "k", nil))
}

func testAdd(t *testing.T, open func() store.Store) {
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
	if v := string(must(s.Get(ctx, "c")).get(t)); v != "-2" {
		t.Fatalf("counter stored as %q, want decimal text -2", v)
	}
	noErr(t, s.Set(ctx, "d", []byte("41")))
	if n := must(s.Add(ctx, "d", 1)).get(t); n != 42 {
		t.Fatalf("Add to set counter = %d, want 42", n)
	}
	noErr(t, s.Set(ctx, "text", []byte("hello")))
	if _, err := s.Add(ctx, "text", 1); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Add to non-integer: %v, want ErrInvalidArgument", err)
	}
	if v := string(must(s.Get(ctx, "text")).get(t)); v != "hello" {
		t.Fatalf("failed Add changed the value to %q", v)
	}
	noErr(t, s.Set(ctx, "max", []byte(strconv.FormatInt(maxInt64, 10))))
	if _, err := s.Add(ctx, "max", 1); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Add overflowing int64: %v, want ErrInvalidArgument", err)
	}
}

func testAddConcurrent(t *testing.T, open func() store.Store) {
	const workers, each = 8, 25
	ctx := ctxFor(t, long)
	var wg sync.WaitGroup
	seen := make(chan int64, workers*each)
	for range workers {
		s := open()
		wg.Go(func() {
			for range each {
				n, err := s.Add(ctx, "counter", 1)
				if err != nil {
					t.Error(err)
					return
				}
				seen <- n
			}
		})
	}
	wg.Wait()
	close(seen)
	distinct := map[int64]bool{}
	for n := range seen {
		if distinct[n] {
			t.Fatalf("two Adds returned %d", n)
		}
		distinct[n] = true
	}
	if v := string(must(open().Get(ctx, "counter")).get(t)); v != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d", v, workers*each)
	}
}

func testCompareSet(t *testing.T, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	ptr := func(s string) *string { return &s }
	cases := []struct {
		name              string
		initial           *string
		expected, desired string
		want              string
		after             *string
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
		got := string(must(s.CompareSet(ctx, key, []byte(c.expected), []byte(c.desired))).get(t))
		if got != c.want {
			t.Errorf("%s: CompareSet returned %q, want %q", c.name, got, c.want)
		}
		ok := must(s.Check(ctx, []string{key})).get(t)
		switch {
		case c.after == nil && ok:
			t.Errorf("%s: key exists afterwards", c.name)
		case c.after != nil && !ok:
			t.Errorf("%s: key absent afterwards", c.name)
		case c.after != nil:
			if v := string(must(s.Get(ctx, key)).get(t)); v != *c.after {
				t.Errorf("%s: value afterwards %q, want %q", c.name, v, *c.after)
			}
		}
	}
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

func testDeleteKey(t *testing.T, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	noErr(t, s.Set(ctx, "k", []byte("v")))
	if !must(s.DeleteKey(ctx, "k")).get(t) {
		t.Fatal("DeleteKey of a present key reported false")
	}
	if must(s.DeleteKey(ctx, "k")).get(t) {
		t.Fatal("DeleteKey of an absent key reported true")
	}
	if must(s.Check(ctx, []string{"k"})).get(t) {
		t.Fatal("deleted key still exists")
	}
	sctx, cancel := context.WithTimeout(ctx, short)
	defer cancel()
	if _, err := s.Get(sctx, "k"); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Get of deleted key: %v, want ErrTimeout", err)
	}
	if n := must(s.Add(ctx, "k", 3)).get(t); n != 3 {
		t.Fatalf("Add after delete = %d, want 3", n)
	}
}

func testNumKeys(t *testing.T, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	base := must(s.NumKeys(ctx)).get(t)
	noErr(t, s.Set(ctx, "n1", []byte("a")))
	noErr(t, s.Set(ctx, "n1", []byte("b")))
	must(s.Add(ctx, "n2", 1)).get(t)
	must(s.CompareSet(ctx, "n3", nil, []byte("x"))).get(t)
	if n := must(s.NumKeys(ctx)).get(t); n != base+3 {
		t.Fatalf("NumKeys = %d, want %d", n, base+3)
	}
	must(s.DeleteKey(ctx, "n2")).get(t)
	if n := must(s.NumKeys(ctx)).get(t); n != base+2 {
		t.Fatalf("NumKeys after delete = %d, want %d", n, base+2)
	}
}

func testCheck(t *testing.T, open func() store.Store) {
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

func testWait(t *testing.T, open func() store.Store) {
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
	if err := waiter.Wait(ctx, []string{"w1", "absent"}, short); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Wait for an absent key: %v, want ErrTimeout", err)
	}
}

func testMulti(t *testing.T, open func() store.Store) {
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
	if must(s.Check(ctx, []string{"a"})).get(t) {
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

// testAppend: torch 1.13 has no APPEND; the client says so and changes
// nothing.
func testAppend(t *testing.T, open func() store.Store) {
	s := open()
	ctx := ctxFor(t, long)
	err := s.Append(ctx, "log", []byte("ab"))
	if !errors.Is(err, errors.ErrUnsupported) || !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Append: %v, want ErrUnsupported and ErrInvalidArgument", err)
	}
	if must(s.Check(ctx, []string{"log"})).get(t) {
		t.Fatal("a refused Append created the key")
	}
}

func testManyWaiters(t *testing.T, open func() store.Store) {
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

func testClose(t *testing.T, open func() store.Store) {
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
	if err := s.Append(ctx, "c", nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}
	_ = s.Close()
}
