package rpc

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// Registry maps function names to handlers, the way net/http's ServeMux maps
// paths. Register functions before the agent starts serving (build a
// Registry and pass it with WithRegistry to Init) so that no peer can call a
// name that is not there yet; functions may also be added to a running agent.
// A Registry is safe for concurrent use.
type Registry struct {
	mu  sync.RWMutex
	fns map[string]*entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{fns: map[string]*entry{}} }

// Registrar is where functions can be registered: a *Registry or an *Agent
// (which registers in its own registry).
type Registrar interface {
	rpcRegistry() *Registry
}

func (r *Registry) rpcRegistry() *Registry { return r }

// entry is one registered function, with its types erased.
type entry struct {
	name    string
	argType reflect.Type
	resType reflect.Type
	async   bool
	// reuseArg: the function keeps nothing of its argument's tensors
	// (ReuseArgMemory), so their memory is reused once the call is over.
	reuseArg bool
	// invoke runs the function on a decoded argument of type argType.
	invoke func(ctx context.Context, arg any) *Future[any]
	// fn identifies the registered function value, so that registering
	// the same one again is no error (funcID).
	fn unsafe.Pointer
}

// funcID identifies a function value: a top-level function is one value
// wherever it is named, a closure is one value per evaluation of its
// literal that captures variables, and a method value one per evaluation.
func funcID[F any](fn F) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&fn))
}

// same reports whether e registers what o does: the same function value,
// the same kind (sync or async) and options.
func (e *entry) same(o *entry) bool {
	return e.fn == o.fn && e.argType == o.argType && e.resType == o.resType && e.async == o.async && e.reuseArg == o.reuseArg
}

// Register adds fn under name: a call to name on this worker decodes its
// argument as an A, runs fn on a goroutine of its own, and sends back the R
// (or the error: the caller gets an error wrapping ErrRemote that carries
// the message). A panic in fn is recovered: the caller gets ErrPanic with
// the panic value and a trimmed stack, and the worker keeps serving.
// Registering the same function under the same name again (with the same
// options) does nothing, so that setup code and extensions may run once per
// agent over one registry; registering another function under a name taken
// is an error wrapping ErrInvalidArgument.
func Register[A, R any](r Registrar, name string, fn func(ctx context.Context, arg A) (R, error), opts ...FuncOption) error {
	if fn == nil {
		return fmt.Errorf("%w: rpc: Register(%q) with a nil function", ErrInvalidArgument, name)
	}
	return r.rpcRegistry().add(withFuncOptions(&entry{
		name:    name,
		argType: reflect.TypeFor[A](),
		resType: reflect.TypeFor[R](),
		fn:      funcID(fn),
		invoke: func(ctx context.Context, arg any) *Future[any] {
			a, err := argAs[A](name, arg)
			if err != nil {
				return Ready[any](nil, err)
			}
			res, err := fn(ctx, a)
			return Ready[any](res, err)
		},
	}, opts))
}

// FuncOption configures a function at registration.
type FuncOption func(*entry)

// ReuseArgMemory declares that the function keeps no reference to its
// argument's tensors, nor to slices of their data, once it has returned
// (or once its future has completed), the way an io.Writer must not retain
// the slice it is given; when the function returns those tensors in its
// result, they may be kept until the reply is sent, which the agent waits
// for. The agent then reuses the memory of the argument's large tensors
// for the next calls at once, rather than when the garbage collector finds
// it unreachable: memory used a moment ago is still in the CPU's caches,
// so copying the next argument in runs several times faster. Breaking the
// promise lets a later call overwrite the tensors the function kept;
// interceptors that keep the argument break it too.
func ReuseArgMemory() FuncOption { return func(e *entry) { e.reuseArg = true } }

func withFuncOptions(e *entry, opts []FuncOption) *entry {
	for _, o := range opts {
		if o != nil {
			o(e)
		}
	}
	return e
}

// RegisterAsync adds fn under name like Register, for functions that finish
// their work later: fn returns at once with a Future, and the reply is sent
// when the future completes, with no goroutine waiting for it in between.
// fn runs in the goroutine that received the call's frame, so it must not
// block. Registering the same function again is no error, as for Register.
func RegisterAsync[A, R any](r Registrar, name string, fn func(ctx context.Context, arg A) *Future[R], opts ...FuncOption) error {
	if fn == nil {
		return fmt.Errorf("%w: rpc: RegisterAsync(%q) with a nil function", ErrInvalidArgument, name)
	}
	return r.rpcRegistry().add(withFuncOptions(&entry{
		name:    name,
		argType: reflect.TypeFor[A](),
		resType: reflect.TypeFor[R](),
		async:   true,
		fn:      funcID(fn),
		invoke: func(ctx context.Context, arg any) *Future[any] {
			a, err := argAs[A](name, arg)
			if err != nil {
				return Ready[any](nil, err)
			}
			f := fn(ctx, a)
			if f == nil {
				return Ready[any](nil, fmt.Errorf("rpc: async function %q returned a nil future", name))
			}
			return Then(f, func(v R, err error) (any, error) { return v, err })
		},
	}, opts))
}

func argAs[A any](name string, v any) (A, error) {
	var a A
	if v == nil {
		return a, nil
	}
	x, ok := v.(A)
	if !ok {
		return a, wrongTypef("function %q takes an argument of type %s, an interceptor passed %T", name, reflect.TypeFor[A](), v)
	}
	return x, nil
}

func (r *Registry) add(e *entry) error {
	if e.name == "" || len(e.name) > maxNameLen || strings.TrimSpace(e.name) != e.name {
		return fmt.Errorf("%w: rpc: function name %q: want a non-empty name without surrounding spaces, at most %d bytes", ErrInvalidArgument, e.name, maxNameLen)
	}
	for _, t := range []reflect.Type{e.argType, e.resType} {
		if err := checkWireType(t, 0); err != nil {
			return fmt.Errorf("rpc: function %q: %w", e.name, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fns == nil {
		r.fns = map[string]*entry{}
	}
	if prev, ok := r.fns[e.name]; ok {
		if prev.same(e) {
			return nil
		}
		return fmt.Errorf("%w: rpc: register: function %q is already registered, with another function or other options (%s → %s); register each function under its own name",
			ErrInvalidArgument, e.name, prev.argType, prev.resType)
	}
	r.fns[e.name] = e
	return nil
}

// checkWireType refuses types that can never travel (channels, functions),
// at registration rather than at the first call.
func checkWireType(t reflect.Type, depth int) error {
	if depth > 20 || t == denseType {
		return nil
	}
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return fmt.Errorf("%w: values of type %s cannot travel", ErrInvalidArgument, t)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return checkWireType(t.Elem(), depth+1)
	case reflect.Map:
		if err := checkWireType(t.Key(), depth+1); err != nil {
			return err
		}
		return checkWireType(t.Elem(), depth+1)
	case reflect.Struct:
		if reflect.PointerTo(t).Implements(marshalerType) {
			return nil
		}
		for _, i := range structFields(t) {
			if err := checkWireType(t.Field(i).Type, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Registry) lookup(name string) *entry {
	r.mu.RLock()
	e := r.fns[name]
	r.mu.RUnlock()
	return e
}

// Names returns the registered names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	names := make([]string, 0, len(r.fns))
	for n := range r.fns {
		names = append(names, n)
	}
	r.mu.RUnlock()
	sort.Strings(names)
	return names
}

// unknownFunction explains a call to a name that is not registered.
func (r *Registry) unknownFunction(worker, name string) error {
	names := r.Names()
	var b strings.Builder
	fmt.Fprintf(&b, "worker %q has no function %q", worker, name)
	if s := suggest(name, names); len(s) > 0 {
		fmt.Fprintf(&b, "; did you mean %s?", strings.Join(quoteAll(s), " or "))
	}
	const show = 20
	switch {
	case len(names) == 0:
		b.WriteString("; it has no functions registered (register them before Init, with WithRegistry)")
	case len(names) <= show:
		fmt.Fprintf(&b, "; registered: %s", strings.Join(names, ", "))
	default:
		fmt.Fprintf(&b, "; registered: %s and %d more", strings.Join(names[:show], ", "), len(names)-show)
	}
	return &handlerError{code: codeUnknownFunction, msg: b.String(), err: ErrUnknownFunction}
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = fmt.Sprintf("%q", x)
	}
	return out
}

// Has reports whether name is registered.
func (r *Registry) Has(name string) bool { return r.lookup(name) != nil }

// Signature returns the argument and result types of the function
// registered under name.
func (r *Registry) Signature(name string) (arg, result reflect.Type, ok bool) {
	e := r.lookup(name)
	if e == nil {
		return nil, nil, false
	}
	return e.argType, e.resType, true
}
