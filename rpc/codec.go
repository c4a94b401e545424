package rpc

import (
	"reflect"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/wire"
)

// The value codec (internal/wire). Arguments and results travel as a
// compact, schema-less byte encoding of their Go value plus raw tensor
// sections:
//
//   - *tensor.Dense anywhere in a value (field, slice element, map value)
//     becomes a reference to a raw section of the frame: dtype, shape and the
//     bytes as they lie in memory, never re-encoded. A tensor passed as the
//     whole argument or result has no encoded part at all. Each tensor goes
//     once, however often the value refers to it; the order of the
//     sections is the order in which the encoder first meets the tensors,
//     and ClientCall.Tensors, ServerCall.Tensors and Response.Tensors list
//     them in that order on both sides.
//   - bool, integers (zig-zag varints), floats and complex numbers (IEEE bits),
//     strings, slices and arrays (numeric ones as one raw block), maps,
//     structs (exported fields in declaration order; a field tagged
//     `rpc:"-"` is skipped) and pointers (nil or the value).
//   - a type whose pointer implements Marshaler and Unmarshaler encodes
//     itself (rref.RRef does: it travels as owner, id and fork).
//   - Any carries a value whose type the receiver picks later.
//
// Both sides must use the same Go type (its name, reflect.Type.String, is
// checked at the top level); interface-typed fields may hold nil or a
// *tensor.Dense only; channels and functions cannot travel.

// Marshaler is implemented by types that encode themselves; the Encoder
// tells them where the value goes (To) and through which agent.
type Marshaler interface {
	MarshalRPC(e *Encoder) error
}

// Unmarshaler is implemented (on the pointer) by types that decode
// themselves; the Decoder tells them who sent the value (From).
type Unmarshaler interface {
	UnmarshalRPC(d *Decoder) error
}

// codec is the wire codec with this package's Marshaler and Unmarshaler.
var codec = &wire.Codec{
	Marshaler:   reflect.TypeFor[Marshaler](),
	Unmarshaler: reflect.TypeFor[Unmarshaler](),
	Marshal:     func(e *wire.Encoder, p any) error { return p.(Marshaler).MarshalRPC(&Encoder{e}) },
	Unmarshal:   func(d *wire.Decoder, p any) error { return p.(Unmarshaler).UnmarshalRPC(&Decoder{d}) },
}

var (
	denseType = reflect.TypeFor[*tensor.Dense]()
	anyType   = reflect.TypeFor[Any]()
)

// nilTypeName is the type name sent for a nil argument or result.
const nilTypeName = wire.NilTypeName

// peerOf describes worker w, seen from agent a (nil outside one), to the
// codec.
func peerOf(a *Agent, w WorkerInfo) wire.Peer {
	p := wire.Peer{Name: w.Name, ID: w.ID}
	if a != nil {
		p.Env = a
	}
	return p
}

func agentOf(p wire.Peer) *Agent {
	a, _ := p.Env.(*Agent)
	return a
}

func workerOf(p wire.Peer) WorkerInfo { return WorkerInfo{Name: p.Name, ID: p.ID} }

// Encoder writes one value's wire form. Marshaler implementations use its
// methods; they must read back exactly what they wrote, in order.
type Encoder struct{ w *wire.Encoder }

// Agent returns the agent sending the value (nil when encoding outside one).
func (e *Encoder) Agent() *Agent { return agentOf(e.w.Peer()) }

// To returns the worker the value is sent to.
func (e *Encoder) To() WorkerInfo { return workerOf(e.w.Peer()) }

// OnUnsent registers fn to run if the value never leaves: the call or reply
// failed before its frame was written (a Marshaler that registered state
// for the receiver, as an RRef's fork, undoes it there).
func (e *Encoder) OnUnsent(fn func()) { e.w.OnUnsent(fn) }

// Uvarint writes an unsigned integer.
func (e *Encoder) Uvarint(v uint64) { e.w.Uvarint(v) }

// Bytes writes a byte string.
func (e *Encoder) Bytes(b []byte) { e.w.Bytes(b) }

// String writes a string.
func (e *Encoder) String(s string) { e.w.String(s) }

// Tensor writes a tensor (nil allowed) as a raw section of the frame.
func (e *Encoder) Tensor(t *tensor.Dense) error { return e.w.Tensor(t) }

// Encode writes a nested value of any supported type.
func (e *Encoder) Encode(v any) error { return e.w.Encode(v) }

// Decoder reads one value's wire form; Unmarshaler implementations use its
// methods.
type Decoder struct{ w *wire.Decoder }

// Agent returns the agent receiving the value (nil outside one).
func (d *Decoder) Agent() *Agent { return agentOf(d.w.Peer()) }

// From returns the worker that sent the value.
func (d *Decoder) From() WorkerInfo { return workerOf(d.w.Peer()) }

// Uvarint reads an unsigned integer.
func (d *Decoder) Uvarint() (uint64, error) { return d.w.Uvarint() }

// Bytes reads a byte string (aliasing the message; copy it to keep it).
func (d *Decoder) Bytes() ([]byte, error) { return d.w.Bytes() }

// String reads a string.
func (d *Decoder) String() (string, error) { return d.w.String() }

// Tensor reads a tensor written by Encoder.Tensor.
func (d *Decoder) Tensor() (*tensor.Dense, error) { return d.w.Tensor() }

// Decode reads a nested value written by Encoder.Encode into *ptr.
func (d *Decoder) Decode(ptr any) error { return d.w.Decode(ptr) }

// decodeTop decodes a whole argument or result of type want, sent as typ;
// an interface type that Any satisfies receives anything but a lone
// tensor as an Any.
func decodeTop(want reflect.Type, typ string, payload []byte, tensors []*tensor.Dense, peer wire.Peer) (reflect.Value, error) {
	if want.Kind() == reflect.Interface && typ != nilTypeName && anyType.AssignableTo(want) &&
		!(wire.IsLoneTensor(typ, payload, tensors) && denseType.AssignableTo(want)) {
		v := reflect.New(want).Elem()
		v.Set(reflect.ValueOf(Any{d: wire.Deferred{Type: typ, Data: payload, Tensors: tensors, Peer: peer}}))
		return v, nil
	}
	return codec.DecodeTop(want, typ, payload, tensors, peer)
}

// maxNameLen bounds a function name (registry.go).
const maxNameLen = wire.MaxNameLen

// For the registry's check of a function's types (registry.go).
var marshalerType = codec.Marshaler

func structFields(t reflect.Type) []int { return wire.StructFields(t) }
