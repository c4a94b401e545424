package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// The value codec. Arguments and results travel as a compact, schema-less
// byte encoding of their Go value plus raw tensor sections:
//
//   - *tensor.Dense anywhere in a value (field, slice element, map value)
//     becomes a reference to a raw section of the frame: dtype, shape and the
//     bytes as they lie in memory, never re-encoded. A tensor passed as the
//     whole argument or result has no encoded part at all.
//   - bool, integers (zig-zag varints), floats and complex numbers (IEEE bits),
//     strings, slices and arrays (numeric ones as one raw block), maps,
//     structs (exported fields in declaration order; a field tagged
//     `rpc:"-"` is skipped) and pointers (nil or the value).
//   - a type whose pointer implements the Codec's Marshaler and Unmarshaler
//     encodes itself (rref.RRef does: it travels as owner, id and fork).
//   - a Deferred value (rpc.Any) carries a value whose type the receiver
//     picks later: its type name, its own table of tensors (indexes into
//     the frame's) and its bytes.
//
// Both sides must use the same Go type (its name, reflect.Type.String, is
// checked at the top level); interface-typed fields may hold nil or a
// *tensor.Dense only (rpc.Any is the way to send a value of a type the
// receiver picks); channels and functions cannot travel.

// Codec says which types encode themselves: those whose pointer implements
// the interface type Marshaler (on sending) or Unmarshaler (on receiving),
// and how to call them. rpc makes one for its Marshaler and Unmarshaler;
// a zero Codec knows no such types. A Codec must not change once in use.
type Codec struct {
	Marshaler   reflect.Type // an interface type; nil: none
	Unmarshaler reflect.Type // an interface type; nil: none
	// Marshal encodes p, a pointer whose type implements Marshaler.
	Marshal func(e *Encoder, p any) error
	// Unmarshal decodes into p, a pointer whose type implements
	// Unmarshaler.
	Unmarshal func(d *Decoder, p any) error

	sizes sync.Map // reflect.Type -> uint64: minSize
}

// Peer is the other end of a value: where it goes (encoding) or whence it
// came (decoding). The codec only hands it to the types that encode
// themselves.
type Peer struct {
	Name string
	ID   int
	// Env is the sender's or receiver's own handle (rpc: its *Agent, nil
	// outside one).
	Env any
}

func (c *Codec) marshals(t reflect.Type) bool {
	return c != nil && c.Marshaler != nil && reflect.PointerTo(t).Implements(c.Marshaler)
}

func (c *Codec) unmarshals(t reflect.Type) bool {
	return c != nil && c.Unmarshaler != nil && reflect.PointerTo(t).Implements(c.Unmarshaler)
}

var (
	denseType    = reflect.TypeFor[*tensor.Dense]()
	littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
)

const maxDepth = 100

// NilTypeName is the type name sent for a nil argument or result.
const NilTypeName = "nil"

// Encoder writes one value's wire form. Marshaler implementations use its
// methods; they must read back exactly what they wrote, in order.
type Encoder struct {
	buf     []byte
	tensors []*tensor.Dense       // contiguous, as sent
	origs   []*tensor.Dense       // as given, to send a tensor used twice once
	seen    map[*tensor.Dense]int // index of origs, once there are many
	unsent  []func()
	peer    Peer
	codec   *Codec
	depth   int
}

// NewEncoder returns an encoder that appends to buf, for a value sent to
// peer.
func (c *Codec) NewEncoder(buf []byte, peer Peer) Encoder {
	return Encoder{buf: buf, peer: peer, codec: c}
}

// Peer returns where the value goes.
func (e *Encoder) Peer() Peer { return e.peer }

// Payload returns the value's encoding so far, tensors excepted.
func (e *Encoder) Payload() []byte { return e.buf }

// Sent returns the tensors of the frame's table, as they travel (a tensor
// that was not contiguous is a contiguous copy).
func (e *Encoder) Sent() []*tensor.Dense { return e.tensors }

// Tensors returns the tensors the value carries, each once, in the order
// they travel: the frame's table, as the value holds them. The receiver's
// table (Frame.Tensors) is in the same order.
func (e *Encoder) Tensors() []*tensor.Dense { return e.origs }

// OnUnsent registers fn to run if the value never leaves: the call or reply
// failed before its frame was written (a Marshaler that registered state
// for the receiver, as an RRef's fork, undoes it there).
func (e *Encoder) OnUnsent(fn func()) { e.unsent = append(e.unsent, fn) }

// Abandon runs the OnUnsent functions: the value will not be sent.
func (e *Encoder) Abandon() {
	for _, fn := range e.unsent {
		fn()
	}
	e.unsent = nil
}

// Uvarint writes an unsigned integer.
func (e *Encoder) Uvarint(v uint64) { e.buf = binary.AppendUvarint(e.buf, v) }

// Bytes writes a byte string.
func (e *Encoder) Bytes(b []byte) {
	e.Uvarint(uint64(len(b)))
	e.buf = append(e.buf, b...)
}

// String writes a string.
func (e *Encoder) String(s string) {
	e.Uvarint(uint64(len(s)))
	e.buf = append(e.buf, s...)
}

// Tensor writes a tensor (nil allowed) as a raw section of the frame.
func (e *Encoder) Tensor(t *tensor.Dense) error {
	if t == nil {
		e.buf = append(e.buf, 0)
		return nil
	}
	i, err := e.addTensor(t)
	if err != nil {
		return err
	}
	e.buf = append(e.buf, 1)
	e.Uvarint(uint64(i))
	return nil
}

// Encode writes a nested value of any supported type.
func (e *Encoder) Encode(v any) error {
	if v == nil {
		e.buf = append(e.buf, 0)
		return nil
	}
	e.buf = append(e.buf, 1)
	return e.value(reflect.ValueOf(v))
}

func (e *Encoder) addTensor(t *tensor.Dense) (int, error) {
	if e.seen != nil {
		if i, ok := e.seen[t]; ok {
			return i, nil
		}
	} else {
		for i, o := range e.origs {
			if o == t {
				return i, nil
			}
		}
	}
	if !littleEndian {
		return 0, fmt.Errorf("%w: rpc: tensors travel in little-endian order; this host is big-endian", errs.InvalidArgument)
	}
	c, err := contiguous(t)
	if err != nil {
		return 0, err
	}
	e.origs = append(e.origs, t)
	e.tensors = append(e.tensors, c)
	if e.seen != nil {
		e.seen[t] = len(e.origs) - 1
	} else if len(e.origs) > 32 {
		e.seen = make(map[*tensor.Dense]int, 2*len(e.origs))
		for i, o := range e.origs {
			e.seen[o] = i
		}
	}
	return len(e.tensors) - 1, nil
}

// EncodeTop encodes a whole argument or result and returns its type name.
func (e *Encoder) EncodeTop(v any) (string, error) {
	if v == nil {
		return NilTypeName, nil
	}
	if t, ok := v.(*tensor.Dense); ok && t != nil {
		_, err := e.addTensor(t)
		return denseType.String(), err
	}
	rv := reflect.ValueOf(v)
	return rv.Type().String(), e.value(rv)
}

func (e *Encoder) value(v reflect.Value) error {
	t := v.Type()
	if t == denseType {
		return e.Tensor(v.Interface().(*tensor.Dense))
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && e.codec.marshals(t) {
		if !v.CanAddr() {
			p := reflect.New(t)
			p.Elem().Set(v)
			v = p.Elem()
		}
		return e.codec.Marshal(e, v.Addr().Interface())
	}
	switch t.Kind() {
	case reflect.Bool:
		b := byte(0)
		if v.Bool() {
			b = 1
		}
		e.buf = append(e.buf, b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		e.buf = binary.AppendVarint(e.buf, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		e.buf = binary.AppendUvarint(e.buf, v.Uint())
	case reflect.Float32:
		e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(float32(v.Float())))
	case reflect.Float64:
		e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(v.Float()))
	case reflect.Complex64:
		c := v.Complex()
		e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(float32(real(c))))
		e.buf = binary.LittleEndian.AppendUint32(e.buf, math.Float32bits(float32(imag(c))))
	case reflect.Complex128:
		c := v.Complex()
		e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(real(c)))
		e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(imag(c)))
	case reflect.String:
		e.String(v.String())
	case reflect.Slice:
		if v.IsNil() {
			e.Uvarint(0)
			return nil
		}
		e.Uvarint(uint64(v.Len()) + 1)
		return e.elements(v)
	case reflect.Array:
		return e.elements(v)
	case reflect.Map:
		if v.IsNil() {
			e.Uvarint(0)
			return nil
		}
		e.Uvarint(uint64(v.Len()) + 1)
		if err := e.enter(t); err != nil {
			return err
		}
		defer e.leave()
		it := v.MapRange()
		for it.Next() {
			if err := e.value(it.Key()); err != nil {
				return err
			}
			if err := e.value(it.Value()); err != nil {
				return err
			}
		}
	case reflect.Struct:
		if err := e.enter(t); err != nil {
			return err
		}
		defer e.leave()
		for _, i := range StructFields(t) {
			if err := e.value(v.Field(i)); err != nil {
				return err
			}
		}
	case reflect.Pointer:
		if v.IsNil() {
			e.buf = append(e.buf, 0)
			return nil
		}
		if err := e.enter(t); err != nil {
			return err
		}
		defer e.leave()
		e.buf = append(e.buf, 1)
		return e.value(v.Elem())
	case reflect.Interface:
		if v.IsNil() {
			e.buf = append(e.buf, 0)
			return nil
		}
		if d, ok := v.Elem().Interface().(*tensor.Dense); ok && d != nil {
			i, err := e.addTensor(d)
			if err != nil {
				return err
			}
			e.buf = append(e.buf, 1)
			e.Uvarint(uint64(i))
			return nil
		}
		return fmt.Errorf("%w: rpc: cannot send a %s held in an interface of type %s: the receiver could not know its type; use a concrete type or rpc.Any", errs.InvalidArgument, v.Elem().Type(), t)
	default:
		return fmt.Errorf("%w: rpc: values of type %s cannot be sent", errs.InvalidArgument, t)
	}
	return nil
}

func (e *Encoder) enter(t reflect.Type) error {
	e.depth++
	if e.depth > maxDepth {
		return fmt.Errorf("%w: rpc: value nested more than %d levels deep (a cycle through %s?)", errs.InvalidArgument, maxDepth, t)
	}
	return nil
}

func (e *Encoder) leave() { e.depth-- }

func (e *Encoder) elements(v reflect.Value) error {
	n := v.Len()
	et := v.Type().Elem()
	if e.codec.rawElem(et) {
		size := n * int(et.Size())
		if size == 0 {
			return nil
		}
		var p unsafe.Pointer
		if v.Kind() == reflect.Slice {
			p = v.UnsafePointer()
		} else if v.CanAddr() {
			p = v.Addr().UnsafePointer()
		} else {
			c := reflect.New(v.Type()).Elem()
			c.Set(v)
			p = c.Addr().UnsafePointer()
		}
		e.buf = append(e.buf, unsafe.Slice((*byte)(p), size)...)
		return nil
	}
	if err := e.enter(v.Type()); err != nil {
		return err
	}
	defer e.leave()
	for i := 0; i < n; i++ {
		if err := e.value(v.Index(i)); err != nil {
			return err
		}
	}
	return nil
}

// rawElem reports whether elements of type t travel as their memory bytes.
func (c *Codec) rawElem(t reflect.Type) bool {
	if !littleEndian {
		return t.Kind() == reflect.Uint8 || t.Kind() == reflect.Int8
	}
	switch t.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return !c.marshals(t)
	}
	return false
}

var fieldCache sync.Map // reflect.Type -> []int

// StructFields returns the indexes of the exported fields of t that travel.
func StructFields(t reflect.Type) []int {
	if f, ok := fieldCache.Load(t); ok {
		return f.([]int)
	}
	var idx []int
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("rpc") == "-" {
			continue
		}
		idx = append(idx, i)
	}
	fieldCache.Store(t, idx)
	return idx
}

// Decoder reads one value's wire form; Unmarshaler implementations use its
// methods.
type Decoder struct {
	b       []byte
	tensors []*tensor.Dense
	peer    Peer
	codec   *Codec
	depth   int
}

// Peer returns where the value came from.
func (d *Decoder) Peer() Peer { return d.peer }

func (d *Decoder) short(what string) error {
	return fmt.Errorf("%w: value ends inside %s", ErrMalformed, what)
}

// Uvarint reads an unsigned integer.
func (d *Decoder) Uvarint() (uint64, error) {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		return 0, d.short("an integer")
	}
	d.b = d.b[n:]
	return v, nil
}

func (d *Decoder) varint() (int64, error) {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		return 0, d.short("an integer")
	}
	d.b = d.b[n:]
	return v, nil
}

func (d *Decoder) byte() (byte, error) {
	if len(d.b) == 0 {
		return 0, d.short("a value")
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c, nil
}

func (d *Decoder) fixed(n int) ([]byte, error) {
	if len(d.b) < n {
		return nil, d.short("a number")
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v, nil
}

// Bytes reads a byte string (aliasing the message; copy it to keep it).
func (d *Decoder) Bytes() ([]byte, error) {
	n, err := d.Uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(d.b)) {
		return nil, d.short("a byte string")
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v, nil
}

// String reads a string.
func (d *Decoder) String() (string, error) {
	b, err := d.Bytes()
	return string(b), err
}

// Tensor reads a tensor written by Encoder.Tensor.
func (d *Decoder) Tensor() (*tensor.Dense, error) {
	flag, err := d.byte()
	if err != nil || flag == 0 {
		return nil, err
	}
	if flag != 1 {
		return nil, fmt.Errorf("%w: tensor flag %d", ErrMalformed, flag)
	}
	i, err := d.Uvarint()
	if err != nil {
		return nil, err
	}
	if i >= uint64(len(d.tensors)) {
		return nil, fmt.Errorf("%w: tensor %d of %d", ErrMalformed, i, len(d.tensors))
	}
	return d.tensors[i], nil
}

// Decode reads a nested value written by Encoder.Encode into *ptr.
func (d *Decoder) Decode(ptr any) error {
	pv := reflect.ValueOf(ptr)
	if pv.Kind() != reflect.Pointer || pv.IsNil() {
		return fmt.Errorf("%w: rpc: Decode needs a non-nil pointer, got %T", errs.InvalidArgument, ptr)
	}
	flag, err := d.byte()
	if err != nil {
		return err
	}
	if flag == 0 {
		pv.Elem().SetZero()
		return nil
	}
	return d.value(pv.Elem())
}

// DecodeTop decodes a whole argument or result of type want, sent as typ
// with payload and the frame's tensors, from peer. want may be an
// interface type only for nil and for a lone tensor.
func (c *Codec) DecodeTop(want reflect.Type, typ string, payload []byte, tensors []*tensor.Dense, peer Peer) (reflect.Value, error) {
	if typ == NilTypeName {
		switch want.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
			return reflect.Zero(want), nil
		}
		return reflect.Value{}, fmt.Errorf("%w: expected %s, got nil", ErrWrongType, want)
	}
	if want.Kind() == reflect.Interface {
		if IsLoneTensor(typ, payload, tensors) && denseType.AssignableTo(want) {
			v := reflect.New(want).Elem()
			v.Set(reflect.ValueOf(tensors[0]))
			return v, nil
		}
		return reflect.Value{}, fmt.Errorf("%w: cannot receive %s as interface type %s; use a concrete type", ErrWrongType, typ, want)
	}
	if typ != want.String() {
		return reflect.Value{}, fmt.Errorf("%w: expected %s, got %s", ErrWrongType, want, typ)
	}
	if want == denseType && len(payload) == 0 && len(tensors) == 1 {
		return reflect.ValueOf(tensors[0]), nil
	}
	d := Decoder{b: payload, tensors: tensors, peer: peer, codec: c}
	v := reflect.New(want).Elem()
	if err := d.value(v); err != nil {
		return reflect.Value{}, err
	}
	if len(d.b) != 0 {
		return reflect.Value{}, fmt.Errorf("%w: %d stray bytes after a %s", ErrMalformed, len(d.b), want)
	}
	return v, nil
}

// IsLoneTensor reports whether a value sent as typ with payload and
// tensors is a whole *tensor.Dense.
func IsLoneTensor(typ string, payload []byte, tensors []*tensor.Dense) bool {
	return typ == denseType.String() && len(payload) == 0 && len(tensors) == 1
}

func (d *Decoder) enter(t reflect.Type) error {
	d.depth++
	if d.depth > maxDepth {
		return fmt.Errorf("%w: value nested more than %d levels deep (%s)", ErrMalformed, maxDepth, t)
	}
	return nil
}

func (d *Decoder) leave() { d.depth-- }

// count reads a nil-or-length prefix of elements that each take at least
// min bytes; ok is false for nil. A count that the bytes left cannot hold
// is refused before anything is allocated for it; elements that may take
// no bytes at all are allowed 65536 beyond the bytes left.
func (d *Decoder) count(min uint64) (n int, ok bool, err error) {
	c, err := d.Uvarint()
	if err != nil || c == 0 {
		return 0, false, err
	}
	c--
	limit := uint64(len(d.b)) + 1<<16
	if min > 0 {
		limit = uint64(len(d.b)) / min
	}
	if c > limit {
		return 0, false, fmt.Errorf("%w: %d elements announced, %d bytes left", ErrMalformed, c, len(d.b))
	}
	return int(c), true, nil
}

// minSize returns the fewest bytes a value of type t encodes to (capped
// at 1<<40), which bounds how many of them a count may announce.
func (c *Codec) minSize(t reflect.Type) uint64 {
	if c == nil {
		return minSize(nil, t, 0)
	}
	if n, ok := c.sizes.Load(t); ok {
		return n.(uint64)
	}
	n := minSize(c, t, 0)
	c.sizes.Store(t, n)
	return n
}

func minSize(c *Codec, t reflect.Type, depth int) uint64 {
	const most = 1 << 40
	if depth > maxDepth {
		return 0
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && c.unmarshals(t) {
		return 0 // it reads what it likes
	}
	switch t.Kind() {
	case reflect.Float32:
		return 4
	case reflect.Float64, reflect.Complex64:
		return 8
	case reflect.Complex128:
		return 16
	case reflect.Array:
		if t.Len() == 0 {
			return 0
		}
		if c.rawElem(t.Elem()) {
			return min(uint64(t.Len())*uint64(t.Elem().Size()), most)
		}
		e := minSize(c, t.Elem(), depth+1)
		if e > most/uint64(t.Len()) {
			return most
		}
		return uint64(t.Len()) * e
	case reflect.Struct:
		var n uint64
		for _, i := range StructFields(t) {
			n = min(n+minSize(c, t.Field(i).Type, depth+1), most)
		}
		return n
	case reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return 0 // refused when met
	}
	// Integers and bools, strings, slices, maps, pointers, interfaces and
	// tensors: a byte at least.
	return 1
}

func (d *Decoder) value(v reflect.Value) error {
	t := v.Type()
	if t == denseType {
		x, err := d.Tensor()
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(x))
		return nil
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && d.codec.unmarshals(t) {
		return d.codec.Unmarshal(d, v.Addr().Interface())
	}
	switch t.Kind() {
	case reflect.Bool:
		b, err := d.byte()
		if err != nil {
			return err
		}
		if b > 1 {
			return fmt.Errorf("%w: bool byte %d", ErrMalformed, b)
		}
		v.SetBool(b == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x, err := d.varint()
		if err != nil {
			return err
		}
		if v.OverflowInt(x) {
			return fmt.Errorf("%w: %d overflows %s", ErrMalformed, x, t)
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x, err := d.Uvarint()
		if err != nil {
			return err
		}
		if v.OverflowUint(x) {
			return fmt.Errorf("%w: %d overflows %s", ErrMalformed, x, t)
		}
		v.SetUint(x)
	case reflect.Float32:
		b, err := d.fixed(4)
		if err != nil {
			return err
		}
		v.SetFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	case reflect.Float64:
		b, err := d.fixed(8)
		if err != nil {
			return err
		}
		v.SetFloat(math.Float64frombits(binary.LittleEndian.Uint64(b)))
	case reflect.Complex64:
		b, err := d.fixed(8)
		if err != nil {
			return err
		}
		v.SetComplex(complex(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4:])))))
	case reflect.Complex128:
		b, err := d.fixed(16)
		if err != nil {
			return err
		}
		v.SetComplex(complex(math.Float64frombits(binary.LittleEndian.Uint64(b)), math.Float64frombits(binary.LittleEndian.Uint64(b[8:]))))
	case reflect.String:
		s, err := d.String()
		if err != nil {
			return err
		}
		v.SetString(s)
	case reflect.Slice:
		n, ok, err := d.count(d.codec.minSize(t.Elem()))
		if err != nil || !ok {
			return err
		}
		s := reflect.MakeSlice(t, n, n)
		if err := d.elements(s, n); err != nil {
			return err
		}
		v.Set(s)
	case reflect.Array:
		return d.elements(v, v.Len())
	case reflect.Map:
		n, ok, err := d.count(d.codec.minSize(t.Key()) + d.codec.minSize(t.Elem()))
		if err != nil || !ok {
			return err
		}
		if err := d.enter(t); err != nil {
			return err
		}
		defer d.leave()
		m := reflect.MakeMapWithSize(t, min(n, 1024))
		for i := 0; i < n; i++ {
			k := reflect.New(t.Key()).Elem()
			if err := d.value(k); err != nil {
				return err
			}
			x := reflect.New(t.Elem()).Elem()
			if err := d.value(x); err != nil {
				return err
			}
			m.SetMapIndex(k, x)
		}
		v.Set(m)
	case reflect.Struct:
		if err := d.enter(t); err != nil {
			return err
		}
		defer d.leave()
		for _, i := range StructFields(t) {
			if err := d.value(v.Field(i)); err != nil {
				return err
			}
		}
	case reflect.Pointer:
		flag, err := d.byte()
		if err != nil {
			return err
		}
		switch flag {
		case 0:
			v.SetZero()
			return nil
		case 1:
		default:
			return fmt.Errorf("%w: pointer flag %d", ErrMalformed, flag)
		}
		if err := d.enter(t); err != nil {
			return err
		}
		defer d.leave()
		p := reflect.New(t.Elem())
		if err := d.value(p.Elem()); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Interface:
		x, err := d.Tensor()
		if err != nil {
			return err
		}
		if x == nil {
			v.SetZero()
			return nil
		}
		if !denseType.AssignableTo(t) {
			return fmt.Errorf("%w: a tensor cannot go in a field of type %s", ErrWrongType, t)
		}
		v.Set(reflect.ValueOf(x))
	default:
		return fmt.Errorf("%w: values of type %s cannot be received", ErrWrongType, t)
	}
	return nil
}

func (d *Decoder) elements(v reflect.Value, n int) error {
	et := v.Type().Elem()
	if d.codec.rawElem(et) {
		size := n * int(et.Size())
		if size == 0 {
			return nil
		}
		b, err := d.fixed(size)
		if err != nil {
			return err
		}
		var p unsafe.Pointer
		if v.Kind() == reflect.Slice {
			p = v.UnsafePointer()
		} else {
			p = v.Addr().UnsafePointer()
		}
		copy(unsafe.Slice((*byte)(p), size), b)
		return nil
	}
	if err := d.enter(v.Type()); err != nil {
		return err
	}
	defer d.leave()
	for i := 0; i < n; i++ {
		if err := d.value(v.Index(i)); err != nil {
			return err
		}
	}
	return nil
}

// Deferred is a value whose decoding waits until its receiver picks a type
// (rpc.Any): its type name, bytes and tensors, as EncodeTop made them.
type Deferred struct {
	Type    string
	Data    []byte
	Tensors []*tensor.Dense
	Peer    Peer // where it came from
}

// EncodeDeferred encodes v apart, with a table of tensors of its own, for
// WriteDeferred; what v's encoding registered with OnUnsent stays with e.
func (e *Encoder) EncodeDeferred(v any) (Deferred, error) {
	sub := Encoder{peer: e.peer, codec: e.codec, depth: e.depth}
	typ, err := sub.EncodeTop(v)
	e.unsent = append(e.unsent, sub.unsent...)
	if err != nil {
		return Deferred{}, err
	}
	return Deferred{Type: typ, Data: sub.buf, Tensors: sub.tensors}, nil
}

// WriteDeferred writes a deferred value: its type name, its tensors as
// indexes into the frame's table, and its bytes.
func (e *Encoder) WriteDeferred(v Deferred) error {
	e.String(v.Type)
	e.Uvarint(uint64(len(v.Tensors)))
	for _, t := range v.Tensors {
		i, err := e.addTensor(t)
		if err != nil {
			return err
		}
		e.Uvarint(uint64(i))
	}
	e.Bytes(v.Data)
	return nil
}

// ReadDeferred reads what WriteDeferred wrote; decoding the value itself
// waits for DecodeDeferred.
func (d *Decoder) ReadDeferred() (Deferred, error) {
	typ, err := d.String()
	if err != nil {
		return Deferred{}, err
	}
	if len(typ) > MaxNameLen || strings.TrimSpace(typ) == "" {
		return Deferred{}, fmt.Errorf("%w: bad type name in an Any", ErrMalformed)
	}
	n, err := d.Uvarint()
	if err != nil {
		return Deferred{}, err
	}
	if n > uint64(len(d.b)) {
		return Deferred{}, fmt.Errorf("%w: Any with %d tensors", ErrMalformed, n)
	}
	tensors := make([]*tensor.Dense, n)
	for i := range tensors {
		j, err := d.Uvarint()
		if err != nil {
			return Deferred{}, err
		}
		if j >= uint64(len(d.tensors)) {
			return Deferred{}, fmt.Errorf("%w: tensor %d of %d", ErrMalformed, j, len(d.tensors))
		}
		tensors[i] = d.tensors[j]
	}
	data, err := d.Bytes()
	if err != nil {
		return Deferred{}, err
	}
	return Deferred{Type: typ, Data: data, Tensors: tensors, Peer: d.peer}, nil
}

// DecodeDeferred decodes a deferred value as type want (see DecodeTop).
func (c *Codec) DecodeDeferred(want reflect.Type, v Deferred) (reflect.Value, error) {
	typ := v.Type
	if typ == "" {
		typ = NilTypeName
	}
	return c.DecodeTop(want, typ, v.Data, v.Tensors, v.Peer)
}
