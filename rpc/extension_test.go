package rpc

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

// testExt is an extension that registers a function and counts its
// installs; its state is the agent's own name.
type testExt struct {
	name     string
	requires []Extension
	installs *atomic.Int32
	order    *[]string
	fail     error
}

func (e *testExt) Name() string { return e.name }

func (e *testExt) Requires() []Extension { return e.requires }

func (e *testExt) Install(a *Agent) (any, error) {
	if e.fail != nil {
		return nil, e.fail
	}
	e.installs.Add(1)
	if e.order != nil {
		*e.order = append(*e.order, e.name)
	}
	if err := Register(a, e.name+".hello", extHello); err != nil {
		return nil, err
	}
	return "state of " + a.Self().Name, nil
}

func extHello(ctx context.Context, _ struct{}) (string, error) { return "hello", nil }

// An extension is installed on the agents given it and on no other; giving
// it twice installs it once; an agent finds its state under its name.
func TestExtensionsInstallWhenAsked(t *testing.T) {
	var n atomic.Int32
	ext := &testExt{name: "ext", installs: &n}
	agents := startGroup(t, 2, nil, WithExtensions(ext, ext), WithExtensions(ext))
	if got := n.Load(); got != 2 {
		t.Fatalf("installs: got %d, want 2 (one per agent)", got)
	}
	for _, a := range agents {
		st, ok := a.Extension("ext")
		if !ok || st != "state of "+a.Self().Name {
			t.Fatalf("Extension(ext) on %s: %v %v", a.Self().Name, st, ok)
		}
		if _, ok := a.Extension("other"); ok {
			t.Fatal("an extension never installed is found")
		}
	}
	ctx := context.Background()
	if s, err := Sync[string](ctx, agents[0], "w1", "ext.hello", struct{}{}); err != nil || s != "hello" {
		t.Fatalf("the extension's function: %q %v", s, err)
	}

	// An agent not given the extension has none of it.
	bare := startGroup(t, 2, nil)
	if _, ok := bare[0].Extension("ext"); ok {
		t.Fatal("an agent not given the extension has it")
	}
	_, err := Sync[string](ctx, bare[0], "w1", "ext.hello", struct{}{})
	if !errors.Is(err, ErrUnknownFunction) {
		t.Fatalf("the extension's function on an agent without it: %v", err)
	}
}

// Requirements are installed first, once, whether listed or not.
func TestExtensionRequirements(t *testing.T) {
	var n atomic.Int32
	var order []string
	base := &testExt{name: "base", installs: &n, order: &order}
	top := &testExt{name: "top", installs: &n, order: &order, requires: []Extension{base}}
	startGroup(t, 1, nil, WithExtensions(top, base))
	if strings.Join(order, ",") != "base,top" {
		t.Fatalf("install order: %v, want base,top", order)
	}
}

// Two different extensions under one name, a nil one, a cycle, or a failing
// install fail Init with an error saying which.
func TestExtensionErrors(t *testing.T) {
	var n atomic.Int32
	a1, a2 := &testExt{name: "dup", installs: &n}, &testExt{name: "dup", installs: &n}
	cyc := &testExt{name: "cyc", installs: &n}
	cyc.requires = []Extension{cyc}
	boom := errors.New("no room")
	for _, c := range []struct {
		name string
		exts []Extension
		is   error
		want string
	}{
		{"same name", []Extension{a1, a2}, ErrInvalidArgument, `two different extensions are named "dup"`},
		{"nil", []Extension{nil}, ErrInvalidArgument, "nil extension"},
		{"cycle", []Extension{cyc}, ErrInvalidArgument, "requires itself"},
		{"install fails", []Extension{&testExt{name: "bad", installs: &n, fail: boom}}, boom, `installing extension "bad"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			a, err := Init(ctx, "solo", 0, 1, WithListenAddr("127.0.0.1:0"), WithExtensions(c.exts...))
			if err == nil {
				a.Close()
				t.Fatal("Init succeeded")
			}
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %v and %q", err, c.is, c.want)
			}
		})
	}
}

// Registering the same function again is no error; another function, or
// the same one with other options, under a taken name is.
func TestRegisterIdempotent(t *testing.T) {
	reg := NewRegistry()
	if err := Register(reg, "hello", extHello); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg, "hello", extHello); err != nil {
		t.Fatalf("the same function again: %v", err)
	}
	other := func(ctx context.Context, _ struct{}) (string, error) { return "other", nil }
	if err := Register(reg, "hello", other); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("another function under the name: %v", err)
	}
	if err := Register(reg, "hello", extHello, ReuseArgMemory()); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("the same function with other options: %v", err)
	}
	async := func(ctx context.Context, _ struct{}) *Future[string] { return Ready("a", nil) }
	if err := RegisterAsync(reg, "hello", async); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an async function under the name: %v", err)
	}
	if err := RegisterAsync(reg, "async", async); err != nil {
		t.Fatal(err)
	}
	if err := RegisterAsync(reg, "async", async); err != nil {
		t.Fatalf("the same async function again: %v", err)
	}
	// Closures of one literal that capture different values are different
	// functions.
	for i := range 2 {
		err := Register(reg, "captured", func(ctx context.Context, _ struct{}) (int, error) { return i, nil })
		if i == 0 && err != nil {
			t.Fatal(err)
		}
		if i == 1 && !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a second closure under the name: %v", err)
		}
	}
}
