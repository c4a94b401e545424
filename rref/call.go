package rref

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/tandemml/tandem/rpc"
)

// Call runs the exported method named method on the referenced value, where
// the value lives (on the owner), with args, and returns its result. Methods
// are found by reflection on the value's dynamic type (for T = *Stage, the
// methods of *Stage). A method may take a context.Context first (the call's
// context is passed), then its arguments; it may return nothing, a result,
// an error, or a result and an error. Call's R is the result's type
// (struct{} for a method without one). Arguments travel as rpc.Any and must
// have the parameters' exact types. Methods may run concurrently with each
// other (one per call): the value must synchronize its own state. Errors
// are *rpc.CallError with Op "call", naming the owner and the method.
func Call[R any, T any](ctx context.Context, ref *RRef[T], method string, args ...any) (R, error) {
	return CallWith[R](ctx, ref, method, args, nil)
}

// CallWith is Call with call options (rpc.WithTimeout, rpc.WithMetadata).
func CallWith[R any, T any](ctx context.Context, ref *RRef[T], method string, args []any, opts []rpc.CallOption) (R, error) {
	r, err := callWith[R](ctx, ref, method, args, opts)
	return r, callError("call", ref.st.owner.Name, method, err)
}

func callWith[R any, T any](ctx context.Context, ref *RRef[T], method string, args []any, opts []rpc.CallOption) (R, error) {
	var zero R
	st := ref.st
	wrapped := make([]rpc.Any, len(args))
	for i, a := range args {
		wrapped[i] = rpc.AnyOf(a)
	}
	if st.entry != nil {
		v, err := st.entry.value.Wait(ctx)
		if err != nil {
			return zero, err
		}
		out, err := invokeMethod(ctx, v, st.id, method, wrapped)
		if err != nil {
			return zero, err
		}
		if out == nil {
			return zero, nil
		}
		r, ok := out.(R)
		if !ok {
			return zero, fmt.Errorf("%w: rref: method %s returned %T, the caller asked for %s", rpc.ErrWrongType, method, out, reflect.TypeFor[R]())
		}
		return r, nil
	}
	if st.released.Load() {
		return zero, fmt.Errorf("%w: rref: Call on %s after Release", rpc.ErrInvalidArgument, st.id)
	}
	return rpc.Sync[R](ctx, st.rc.agent, st.owner.Name, fnCall, callReq{ID: st.id, Method: method, Args: wrapped}, opts...)
}

var (
	ctxType = reflect.TypeFor[context.Context]()
	errType = reflect.TypeFor[error]()
)

func serveCall(ctx context.Context, req callReq) (any, error) {
	rc, err := handlerContext(ctx)
	if err != nil {
		return nil, err
	}
	e := rc.entry(req.ID)
	v, err := e.value.Wait(ctx)
	if err != nil {
		rc.dropPlaceholder(e)
		return nil, err
	}
	return invokeMethod(ctx, v, req.ID, req.Method, req.Args)
}

// invokeMethod calls method on v with args decoded to its parameter types.
func invokeMethod(ctx context.Context, v any, id ID, method string, args []rpc.Any) (any, error) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() {
		return nil, fmt.Errorf("%w: rref: %s holds nil; it has no method %q", rpc.ErrInvalidArgument, id, method)
	}
	m := rv.MethodByName(method)
	if !m.IsValid() {
		return nil, fmt.Errorf("%w: rref: %s holds a %s, which has no exported method %q; methods: %s", rpc.ErrInvalidArgument, id, rv.Type(), method, methodNames(rv.Type()))
	}
	mt := m.Type()
	in := make([]reflect.Value, 0, mt.NumIn())
	first := 0
	if mt.NumIn() > 0 && mt.In(0) == ctxType {
		in = append(in, reflect.ValueOf(ctx))
		first = 1
	}
	if mt.IsVariadic() {
		return nil, fmt.Errorf("%w: rref: method %s.%s is variadic, which Call does not support", rpc.ErrInvalidArgument, rv.Type(), method)
	}
	if want := mt.NumIn() - first; want != len(args) {
		return nil, fmt.Errorf("%w: rref: method %s.%s takes %d argument(s), got %d", rpc.ErrWrongType, rv.Type(), method, want, len(args))
	}
	for i, a := range args {
		pt := mt.In(first + i)
		x, err := a.DecodeType(pt)
		if err != nil {
			return nil, fmt.Errorf("rref: argument %d of %s.%s: %w", i+1, rv.Type(), method, err)
		}
		in = append(in, x)
	}
	out := m.Call(in)
	switch mt.NumOut() {
	case 0:
		return struct{}{}, nil
	case 1:
		if mt.Out(0) == errType {
			if err, _ := out[0].Interface().(error); err != nil {
				return nil, err
			}
			return struct{}{}, nil
		}
		return out[0].Interface(), nil
	case 2:
		if mt.Out(1) != errType {
			break
		}
		if err, _ := out[1].Interface().(error); err != nil {
			return nil, err
		}
		return out[0].Interface(), nil
	}
	return nil, fmt.Errorf("%w: rref: method %s.%s must return nothing, a value, an error, or a value and an error", rpc.ErrInvalidArgument, rv.Type(), method)
}

func methodNames(t reflect.Type) string {
	var names []string
	for i := 0; i < t.NumMethod(); i++ {
		if n := t.Method(i).Name; n != "MarshalRPC" && n != "UnmarshalRPC" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, ", ")
}
