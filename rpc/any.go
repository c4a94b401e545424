package rpc

import (
	"fmt"
	"reflect"

	"github.com/tandemml/tandem/internal/wire"
)

// Any carries a value whose type the receiver chooses when it decodes it:
// heterogeneous argument lists (rref.Call sends its arguments this way), or
// a result received as `any`. Make one with AnyOf; a received one is decoded
// with Decode. A received Any can be sent on unchanged.
type Any struct {
	val any
	set bool
	d   wire.Deferred // a received value
}

// AnyOf wraps v for sending.
func AnyOf(v any) Any { return Any{val: v, set: true} }

// TypeName returns the Go type name of the value (reflect.Type.String), or
// "nil".
func (a Any) TypeName() string {
	if a.set {
		if a.val == nil {
			return nilTypeName
		}
		return reflect.TypeOf(a.val).String()
	}
	if a.d.Type == "" {
		return nilTypeName
	}
	return a.d.Type
}

// Decode stores the value in *ptr, whose type must be the value's type.
func (a Any) Decode(ptr any) error {
	pv := reflect.ValueOf(ptr)
	if pv.Kind() != reflect.Pointer || pv.IsNil() {
		return fmt.Errorf("%w: rpc: Any.Decode needs a non-nil pointer, got %T", ErrInvalidArgument, ptr)
	}
	v, err := a.DecodeType(pv.Elem().Type())
	if err != nil {
		return err
	}
	pv.Elem().Set(v)
	return nil
}

// DecodeType returns the value as type t (the value's own type, or an
// interface it satisfies when the value is a tensor or nil).
func (a Any) DecodeType(t reflect.Type) (reflect.Value, error) {
	if a.set {
		if a.val == nil {
			return codec.DecodeTop(t, nilTypeName, nil, nil, wire.Peer{})
		}
		rv := reflect.ValueOf(a.val)
		if rv.Type() == t || (t.Kind() == reflect.Interface && rv.Type().AssignableTo(t)) {
			out := reflect.New(t).Elem()
			out.Set(rv)
			return out, nil
		}
		return reflect.Value{}, fmt.Errorf("%w: expected %s, got %s", ErrWrongType, t, rv.Type())
	}
	d := a.d
	if d.Type == "" {
		d.Type = nilTypeName
	}
	return decodeTop(t, d.Type, d.Data, d.Tensors, d.Peer)
}

// MarshalRPC writes the type name, the value's bytes and its own table of
// tensors, so that the value can be decoded (or forwarded) later.
func (a *Any) MarshalRPC(e *Encoder) error {
	d := a.d
	if a.set || d.Type == "" {
		var err error
		if d, err = e.w.EncodeDeferred(a.val); err != nil {
			return err
		}
	}
	return e.w.WriteDeferred(d)
}

// UnmarshalRPC reads what MarshalRPC wrote; decoding the value itself waits
// for Decode.
func (a *Any) UnmarshalRPC(d *Decoder) error {
	v, err := d.w.ReadDeferred()
	if err != nil {
		return err
	}
	*a = Any{d: v}
	return nil
}
