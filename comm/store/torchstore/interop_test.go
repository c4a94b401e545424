package torchstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// TestGoClientPythonMaster: a Python process runs torch's TCPStore master and
// a Go client shares its keys in both directions.
func TestGoClientPythonMaster(t *testing.T) {
	py := startPython(t)
	var port int
	py.do("open", map[string]any{"s": "m", "port": 0, "world": 2, "master": true,
		"wait_for_workers": false, "timeout_ms": 20000}, &port)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ctx := ctxFor(t, 60*time.Second)

	c, err := Dial(ctx, addr, CountIn(), WithTimeout(20*time.Second))
	noErr(t, err)
	t.Cleanup(func() { c.Close() })

	// CountIn added to torch's own init/ counter, outside the "/" prefix.
	raw, err := Dial(ctx, addr, WithKeyPrefix(""))
	noErr(t, err)
	t.Cleanup(func() { raw.Close() })
	if v := string(must(raw.Get(ctx, InitKey)).get(t)); v != "1" {
		t.Fatalf("init/ after a Go client counted in = %q, want 1", v)
	}

	// Go sets, Python reads; Python sets, Go reads.
	noErr(t, c.Set(ctx, "from-go", []byte("hello python")))
	if v := py.get("m", "from-go"); v != "hello python" {
		t.Fatalf("python read %q", v)
	}
	py.set("m", "from-py", "hello go")
	if v := string(must(c.Get(ctx, "from-py")).get(t)); v != "hello go" {
		t.Fatalf("go read %q", v)
	}
	bin := string([]byte{0, 1, 2, 255, 0})
	noErr(t, c.Set(ctx, "bin", []byte(bin)))
	if v := py.get("m", "bin"); v != bin {
		t.Fatalf("python read binary %q", v)
	}

	// A Go Get blocks until Python sets the key.
	got := make(chan string, 1)
	go func() {
		v, err := c.Get(ctx, "late")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(v)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the key was set", v)
	default:
	}
	py.set("m", "late", "now")
	if v := <-got; v != "now" {
		t.Fatalf("blocked Get: %s", v)
	}

	// Add from both sides.
	if n := must(c.Add(ctx, "cnt", 5)).get(t); n != 5 {
		t.Fatalf("go add = %d", n)
	}
	if n := py.add("m", "cnt", 3); n != 8 {
		t.Fatalf("python add = %d", n)
	}
	if n := must(c.Add(ctx, "cnt", -10)).get(t); n != -2 {
		t.Fatalf("go add = %d", n)
	}
	// A key that is no counter: the master drops the connection, the client
	// says why.
	py.set("m", "text", "hello")
	if _, err := c.Add(ctx, "text", 1); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Add to a non-integer key: %v, want ErrInvalidArgument", err)
	}

	// CompareSet, checked from Python.
	if v := string(must(c.CompareSet(ctx, "cas", nil, []byte("first"))).get(t)); v != "first" {
		t.Fatalf("cas on absent key = %q", v)
	}
	if v := string(must(c.CompareSet(ctx, "cas", []byte("wrong"), []byte("x"))).get(t)); v != "first" {
		t.Fatalf("cas with wrong expected = %q", v)
	}
	if v := string(must(c.CompareSet(ctx, "cas", []byte("first"), []byte("second"))).get(t)); v != "second" {
		t.Fatalf("cas = %q", v)
	}
	if v := string(must(c.CompareSet(ctx, "cas-absent", []byte("e"), []byte("x"))).get(t)); v != "e" {
		t.Fatalf("cas on absent key with expected = %q, want the expected value back", v)
	}
	if v := py.get("m", "cas"); v != "second" {
		t.Fatalf("python read cas = %q", v)
	}
	if v := py.cas("m", "cas", "second", "third"); v != "third" {
		t.Fatalf("python cas = %q", v)
	}
	if v := string(must(c.Get(ctx, "cas")).get(t)); v != "third" {
		t.Fatalf("go read python's cas = %q", v)
	}

	// Wait: one that times out, then the client still works; one that the
	// Python side satisfies.
	start := time.Now()
	err = c.Wait(ctx, []string{"never"}, 300*time.Millisecond)
	if !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("Wait for a missing key: %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el < 250*time.Millisecond || el > 10*time.Second {
		t.Fatalf("Wait with a 300ms timeout returned after %v", el)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait(ctx, []string{"w1", "w2"}, 20*time.Second) }()
	py.set("m", "w1", "a")
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned with one key of two: %v", err)
	default:
	}
	py.add("m", "w2", 1)
	noErr(t, <-done)

	// Check (the protocol's CHECK, which the Python API lacks in 1.13).
	if !must(c.Check(ctx, []string{"w1", "w2"})).get(t) {
		t.Fatal("Check of present keys = false")
	}
	if must(c.Check(ctx, []string{"w1", "never"})).get(t) {
		t.Fatal("Check with a missing key = true")
	}

	// NumKeys agrees with Python's; DeleteKey is seen by Python.
	if g, p := must(c.NumKeys(ctx)).get(t), py.numKeys("m"); g != p {
		t.Fatalf("go num_keys %d, python %d", g, p)
	}
	before := py.numKeys("m")
	if !must(c.DeleteKey(ctx, "from-py")).get(t) {
		t.Fatal("DeleteKey of a present key = false")
	}
	if must(c.DeleteKey(ctx, "from-py")).get(t) {
		t.Fatal("DeleteKey of an absent key = true")
	}
	if n := py.numKeys("m"); n != before-1 {
		t.Fatalf("python num_keys after go delete = %d, want %d", n, before-1)
	}
	if py.deleteKey("m", "from-go") != true {
		t.Fatal("python delete of a key go set = false")
	}
	if must(c.Check(ctx, []string{"from-go"})).get(t) {
		t.Fatal("key python deleted still exists for go")
	}

	// MultiSet / MultiGet, from the primitives.
	noErr(t, c.MultiSet(ctx, []string{"m1", "m2"}, [][]byte{[]byte("one"), []byte("two")}))
	if a, b := py.get("m", "m1"), py.get("m", "m2"); a != "one" || b != "two" {
		t.Fatalf("python read multi-set %q %q", a, b)
	}
	vs, err := c.MultiGet(ctx, []string{"m2", "cas", "m1"})
	noErr(t, err)
	if fmt.Sprintf("%q", vs) != `["two" "third" "one"]` {
		t.Fatalf("MultiGet = %q", vs)
	}

	// The key layout of torchrun's agent store: torch's env:// init wraps
	// it in PrefixStore("/worker/attempt_<restart count>"), which
	// store.NewPrefix over this client reproduces.
	py.do("prefix", map[string]any{"s": "worker", "base": "m", "prefix": "/worker/attempt_0"}, nil)
	agent := store.NewPrefix("/worker/attempt_0", c)
	noErr(t, agent.Set(ctx, "rank0-addr", []byte("10.0.0.1:1234")))
	if v := py.get("worker", "rank0-addr"); v != "10.0.0.1:1234" {
		t.Fatalf("python PrefixStore read %q", v)
	}
	py.set("worker", "from-prefixed-py", "ok")
	if v := string(must(agent.Get(ctx, "from-prefixed-py")).get(t)); v != "ok" {
		t.Fatalf("go prefix store read %q", v)
	}

	// Append has no query in 1.13.
	if err := c.Append(ctx, "log", []byte("x")); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Append: %v, want ErrUnsupported", err)
	}
}

// TestGoClientCountsInForPythonMaster: a Python master built with a world
// size and wait_for_workers (the default) blocks until the Go client counts
// in, as it would for a torch worker.
func TestGoClientCountsInForPythonMaster(t *testing.T) {
	py := startPython(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	opened := py.start("open", map[string]any{"s": "m", "port": port, "world": 2, "master": true,
		"wait_for_workers": true, "timeout_ms": 30000, "async": true})
	select {
	case r := <-opened:
		t.Fatalf("the master returned before its second worker joined: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	ctx := ctxFor(t, 60*time.Second)
	c, err := Dial(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), CountIn())
	noErr(t, err)
	defer c.Close()
	if r := py.await("open", opened); r.Err != "" {
		t.Fatalf("master: %s", r.Err)
	}
	noErr(t, c.Set(ctx, "joined", []byte("yes")))
	if v := py.get("m", "joined"); v != "yes" {
		t.Fatalf("python read %q", v)
	}
}

// TestPythonClientsGoServer: Python clients (several at once) and Go clients
// share one Go server.
func TestPythonClientsGoServer(t *testing.T) {
	py := startPython(t)
	srv := startServer(t)
	ctx := ctxFor(t, 90*time.Second)
	const nPy = 6
	pyStores := make([]string, nPy)
	for i := range nPy {
		// A world size makes each count itself in under init/, as torch
		// workers do.
		pyStores[i] = fmt.Sprintf("p%d", i)
		py.open(pyStores[i], srv.Port(), nPy)
	}
	// Each torch 1.13 client holds two connections, the second silent.
	waitFor(t, func() bool { return srv.NumConns() == 2*nPy }, "%d connections from %d python clients, have %d",
		2*nPy, nPy, srv.NumConns())
	raw := dialT(t, srv, WithKeyPrefix(""))
	if v := string(must(raw.Get(ctx, InitKey)).get(t)); v != strconv.Itoa(nPy) {
		t.Fatalf("init/ = %q after %d python clients, want %d", v, nPy, nPy)
	}
	const nGo = 3
	gos := make([]*Client, nGo)
	for i := range gos {
		gos[i] = dialT(t, srv)
	}
	g := gos[0]

	// Keys both ways, across clients.
	py.set("p0", "py-key", "from python")
	if v := string(must(g.Get(ctx, "py-key")).get(t)); v != "from python" {
		t.Fatalf("go read %q", v)
	}
	noErr(t, g.Set(ctx, "go-key", []byte("from go")))
	for i := range nPy {
		if v := py.get(fmt.Sprintf("p%d", i), "go-key"); v != "from go" {
			t.Fatalf("python p%d read %q", i, v)
		}
	}
	py.set("p1", "go-key", "overwritten")
	if v := string(must(gos[2].Get(ctx, "go-key")).get(t)); v != "overwritten" {
		t.Fatalf("go read %q", v)
	}

	// A Python wait whose timeout expires. torch leaves that wait pending
	// on the server, so that store object is not used again.
	py.open("expiring", srv.Port(), nil)
	errText := py.doErr("wait", map[string]any{"s": "expiring", "keys": []string{"never"}, "timeout_ms": 300})
	if !isSocketTimeout(errText) {
		t.Fatalf("python wait for a missing key: %s, want torch's Socket Timeout", errText)
	}
	py.do("close", map[string]any{"s": "expiring"}, nil)

	// A Python wait satisfied by Go.
	waiting := py.start("wait", map[string]any{"s": "p2", "keys": []string{"from-go-later", "go-key"},
		"timeout_ms": 30000, "async": true})
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-waiting:
		t.Fatalf("python wait returned before go set the key: %+v", r)
	default:
	}
	noErr(t, gos[1].Set(ctx, "from-go-later", []byte("x")))
	if r := py.await("wait", waiting); r.Err != "" {
		t.Fatalf("python wait: %s", r.Err)
	}

	// A Go wait satisfied by Python, and one that expires.
	done := make(chan error, 1)
	go func() { done <- g.Wait(ctx, []string{"from-py-later"}, 30*time.Second) }()
	time.Sleep(100 * time.Millisecond)
	py.set("p0", "from-py-later", "y")
	noErr(t, <-done)
	if err := g.Wait(ctx, []string{"never"}, 200*time.Millisecond); !errors.Is(err, store.ErrTimeout) {
		t.Fatalf("go wait for a missing key: %v, want ErrTimeout", err)
	}

	// Add from many clients at once: a thread per Python client and three
	// Go clients, 50 each.
	const each = 50
	pyAdds := py.start("add_many", map[string]any{"stores": pyStores, "key": "counter",
		"n": each, "async": true})
	var wg sync.WaitGroup
	goSeen := make(chan int64, nGo*each)
	for _, c := range gos {
		wg.Go(func() {
			for range each {
				n, err := c.Add(ctx, "counter", 1)
				if err != nil {
					t.Error(err)
					return
				}
				goSeen <- n
			}
		})
	}
	wg.Wait()
	close(goSeen)
	r := py.await("add_many", pyAdds)
	if r.Err != "" {
		t.Fatalf("python adds: %s", r.Err)
	}
	var all []int64
	if err := json.Unmarshal(r.OK, &all); err != nil {
		t.Fatal(err)
	}
	for n := range goSeen {
		all = append(all, n)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) != (nPy+nGo)*each {
		t.Fatalf("%d adds answered, want %d", len(all), (nPy+nGo)*each)
	}
	for i, n := range all {
		if n != int64(i+1) {
			t.Fatalf("add results are not 1..%d without repeats: position %d holds %d", len(all), i, n)
		}
	}
	if v := py.get("p1", "counter"); v != strconv.Itoa((nPy+nGo)*each) {
		t.Fatalf("counter = %q", v)
	}

	// CompareSet both ways.
	if v := py.cas("p0", "lock", "", "python"); v != "python" {
		t.Fatalf("python cas on absent key = %q", v)
	}
	if v := string(must(g.CompareSet(ctx, "lock", nil, []byte("go"))).get(t)); v != "python" {
		t.Fatalf("go cas losing the race = %q", v)
	}
	if v := string(must(g.CompareSet(ctx, "lock", []byte("python"), []byte("go"))).get(t)); v != "go" {
		t.Fatalf("go cas = %q", v)
	}
	if v := py.cas("p1", "lock", "python", "again"); v != "go" {
		t.Fatalf("python cas with a stale expected = %q", v)
	}
	if v := py.cas("p1", "lock-absent", "e", "x"); v != "e" {
		t.Fatalf("python cas on an absent key with expected = %q", v)
	}

	// DeleteKey and NumKeys, both ways.
	if pn, gn := py.numKeys("p2"), must(g.NumKeys(ctx)).get(t); pn != gn {
		t.Fatalf("python num_keys %d, go %d", pn, gn)
	}
	n0 := must(g.NumKeys(ctx)).get(t)
	if !py.deleteKey("p0", "py-key") {
		t.Fatal("python delete of a present key = false")
	}
	if py.deleteKey("p0", "py-key") {
		t.Fatal("python delete of an absent key = true")
	}
	if must(g.Check(ctx, []string{"py-key"})).get(t) {
		t.Fatal("go sees the key python deleted")
	}
	if !must(g.DeleteKey(ctx, "lock")).get(t) {
		t.Fatal("go delete = false")
	}
	if n := py.numKeys("p1"); n != n0-2 {
		t.Fatalf("python num_keys after two deletes = %d, want %d", n, n0-2)
	}
}
