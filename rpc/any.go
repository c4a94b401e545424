package rpc

import (
	"fmt"
	"reflect"
	"strings"

	"gorgonia.org/tensor"
)

// Any carries a value whose type the receiver chooses when it decodes it:
// heterogeneous argument lists (rref.Call sends its arguments this way), or
// a result received as `any`. Make one with AnyOf; a received one is decoded
// with Decode. A received Any can be sent on unchanged.
type Any struct {
	val     any
	set     bool
	typ     string
	data    []byte
	tensors []*tensor.Dense
	agent   *Agent
	from    WorkerInfo
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
	if a.typ == "" {
		return nilTypeName
	}
	return a.typ
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
			return decodeTop(t, nilTypeName, nil, nil, nil, WorkerInfo{})
		}
		rv := reflect.ValueOf(a.val)
		if rv.Type() == t || (t.Kind() == reflect.Interface && rv.Type().AssignableTo(t)) {
			out := reflect.New(t).Elem()
			out.Set(rv)
			return out, nil
		}
		return reflect.Value{}, fmt.Errorf("%w: expected %s, got %s", ErrWrongType, t, rv.Type())
	}
	typ := a.typ
	if typ == "" {
		typ = nilTypeName
	}
	return decodeTop(t, typ, a.data, a.tensors, a.agent, a.from)
}

// MarshalRPC writes the type name, the value's bytes and its own table of
// tensors, so that the value can be decoded (or forwarded) later.
func (a *Any) MarshalRPC(e *Encoder) error {
	typ, data, tensors := a.typ, a.data, a.tensors
	if a.set || typ == "" {
		sub := Encoder{agent: e.agent, to: e.to, depth: e.depth}
		var err error
		typ, err = sub.encodeTop(a.val)
		e.unsent = append(e.unsent, sub.unsent...)
		if err != nil {
			return err
		}
		data, tensors = sub.buf, sub.tensors
	}
	e.String(typ)
	e.Uvarint(uint64(len(tensors)))
	for _, t := range tensors {
		i, err := e.addTensor(t)
		if err != nil {
			return err
		}
		e.Uvarint(uint64(i))
	}
	e.Bytes(data)
	return nil
}

// UnmarshalRPC reads what MarshalRPC wrote; decoding the value itself waits
// for Decode.
func (a *Any) UnmarshalRPC(d *Decoder) error {
	typ, err := d.String()
	if err != nil {
		return err
	}
	if len(typ) > maxNameLen || strings.TrimSpace(typ) == "" {
		return fmt.Errorf("%w: bad type name in an Any", ErrMalformed)
	}
	n, err := d.Uvarint()
	if err != nil {
		return err
	}
	if n > uint64(len(d.b)) {
		return fmt.Errorf("%w: Any with %d tensors", ErrMalformed, n)
	}
	tensors := make([]*tensor.Dense, n)
	for i := range tensors {
		j, err := d.Uvarint()
		if err != nil {
			return err
		}
		if j >= uint64(len(d.tensors)) {
			return fmt.Errorf("%w: tensor %d of %d", ErrMalformed, j, len(d.tensors))
		}
		tensors[i] = d.tensors[j]
	}
	data, err := d.Bytes()
	if err != nil {
		return err
	}
	*a = Any{typ: typ, data: data, tensors: tensors, agent: d.agent, from: d.from}
	return nil
}
