package torchstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// python is the interpreter with Debian's python3-torch; the one first on
// PATH may be another without torch.
const python = "/usr/bin/python3"

// pyPeer is one Python process running testdata/torchpeer.py: it holds
// torch TCPStore objects by name and runs commands on them.
type pyPeer struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  *json.Encoder
	stderr *bytes.Buffer

	mu      sync.Mutex
	nextID  int
	pending map[int]chan pyReply
	exited  chan struct{}
}

type pyReply struct {
	OK  json.RawMessage `json:"ok"`
	Err string          `json:"err"`
}

// startPython starts the peer, or skips the test (saying why) when
// /usr/bin/python3 cannot import torch.
func startPython(t *testing.T) *pyPeer {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("skipping: %s is missing (%v); install Debian's python3-torch to run the PyTorch interoperability tests", python, err)
	}
	script, err := filepath.Abs("testdata/torchpeer.py")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-u", script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &pyPeer{t: t, cmd: cmd, stdin: json.NewEncoder(in), stderr: &bytes.Buffer{},
		pending: map[int]chan pyReply{}, exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewScanner(outPipe)
	out.Buffer(nil, 1<<20)
	ready := make(chan map[string]any, 1)
	go func() {
		defer close(p.exited)
		first := true
		for out.Scan() {
			line := out.Bytes()
			if first {
				first = false
				var m map[string]any
				json.Unmarshal(line, &m)
				ready <- m
				continue
			}
			var r struct {
				ID int `json:"id"`
				pyReply
			}
			if err := json.Unmarshal(line, &r); err != nil {
				continue
			}
			p.mu.Lock()
			ch := p.pending[r.ID]
			delete(p.pending, r.ID)
			p.mu.Unlock()
			if ch != nil {
				ch <- r.pyReply
			}
		}
		close(ready)
	}()
	t.Cleanup(func() {
		p.stdin.Encode(map[string]any{"op": "quit"})
		in.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.exited
		}
		cmd.Wait()
		if t.Failed() {
			t.Logf("python stderr:\n%s", p.stderrText())
		}
	})
	select {
	case m, ok := <-ready:
		if !ok {
			t.Fatalf("python exited before it was ready; stderr:\n%s", p.stderrText())
		}
		if why, ok := m["skip"]; ok {
			t.Skipf("skipping: %s cannot import torch (%v); install Debian's python3-torch to run the PyTorch interoperability tests", python, why)
		}
		t.Logf("python peer ready, torch %v", m["ready"])
	case <-time.After(60 * time.Second):
		t.Fatalf("python did not start within 60s; stderr:\n%s", p.stderrText())
	}
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *pyPeer) stderrText() string {
	lw := p.cmd.Stderr.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.String()
}

// start sends a command and returns where its reply will come.
func (p *pyPeer) start(op string, args map[string]any) <-chan pyReply {
	ch := make(chan pyReply, 1)
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	p.pending[id] = ch
	msg := map[string]any{"id": id, "op": op}
	for k, v := range args {
		msg[k] = v
	}
	err := p.stdin.Encode(msg)
	p.mu.Unlock()
	if err != nil {
		p.t.Fatalf("python %s: %v", op, err)
	}
	return ch
}

// await waits for a reply, at most 60s.
func (p *pyPeer) await(op string, ch <-chan pyReply) pyReply {
	p.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-p.exited:
		p.t.Fatalf("python exited during %s; stderr:\n%s", op, p.stderrText())
	case <-time.After(60 * time.Second):
		p.t.Fatalf("python %s did not answer within 60s", op)
	}
	return pyReply{}
}

// do runs a command, failing the test on a Python error, and decodes its
// result into out (when not nil).
func (p *pyPeer) do(op string, args map[string]any, out any) {
	p.t.Helper()
	r := p.await(op, p.start(op, args))
	if r.Err != "" {
		p.t.Fatalf("python %s %v: %s", op, args, r.Err)
	}
	if out != nil {
		if err := json.Unmarshal(r.OK, out); err != nil {
			p.t.Fatalf("python %s: result %s: %v", op, r.OK, err)
		}
	}
}

// doErr runs a command that must fail and returns its error text.
func (p *pyPeer) doErr(op string, args map[string]any) string {
	p.t.Helper()
	r := p.await(op, p.start(op, args))
	if r.Err == "" {
		p.t.Fatalf("python %s %v succeeded (%s), want an error", op, args, r.OK)
	}
	return r.Err
}

// Shorthands for the store commands of a named Python store s.

func (p *pyPeer) set(s, key, value string) {
	p.t.Helper()
	p.do("set", map[string]any{"s": s, "key": key, "hex": hex.EncodeToString([]byte(value))}, nil)
}

func (p *pyPeer) get(s, key string) string {
	p.t.Helper()
	var h string
	p.do("get", map[string]any{"s": s, "key": key}, &h)
	b, err := hex.DecodeString(h)
	if err != nil {
		p.t.Fatal(err)
	}
	return string(b)
}

func (p *pyPeer) add(s, key string, n int64) int64 {
	p.t.Helper()
	var v int64
	p.do("add", map[string]any{"s": s, "key": key, "n": n}, &v)
	return v
}

func (p *pyPeer) cas(s, key, expected, desired string) string {
	p.t.Helper()
	var h string
	p.do("cas", map[string]any{"s": s, "key": key,
		"exp": hex.EncodeToString([]byte(expected)), "des": hex.EncodeToString([]byte(desired))}, &h)
	b, _ := hex.DecodeString(h)
	return string(b)
}

func (p *pyPeer) numKeys(s string) int64 {
	p.t.Helper()
	var n int64
	p.do("num_keys", map[string]any{"s": s}, &n)
	return n
}

func (p *pyPeer) deleteKey(s, key string) bool {
	p.t.Helper()
	var ok bool
	p.do("delete", map[string]any{"s": s, "key": key}, &ok)
	return ok
}

// open makes a Python TCPStore client of the server at port, named s.
func (p *pyPeer) open(s string, port int, world any) {
	p.t.Helper()
	p.do("open", map[string]any{"s": s, "port": port, "world": world, "timeout_ms": 20000}, nil)
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

// must pairs a call's results for checking: must(c.Get(ctx, k)).get(t).
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

// isSocketTimeout reports whether a Python error is torch's wait timeout.
func isSocketTimeout(err string) bool { return strings.Contains(err, "Socket Timeout") }
