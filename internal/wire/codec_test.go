package wire

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"testing"

	"gorgonia.org/tensor"
)

func dense(shape []int, data any) *tensor.Dense {
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(data))
}

func sameTensor(a, b *tensor.Dense) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Dtype() != b.Dtype() || !a.Shape().Eq(b.Shape()) {
		return false
	}
	// gorgonia's Data panics on a tensor with no elements.
	return a.DataSize() == 0 && b.DataSize() == 0 || reflect.DeepEqual(a.Data(), b.Data())
}

// The codec of these tests: selfCoded and later encode themselves, as
// rpc's Marshaler types do.
type (
	testMarshaler   interface{ MarshalTest(e *Encoder) error }
	testUnmarshaler interface{ UnmarshalTest(d *Decoder) error }
)

var testCodec = &Codec{
	Marshaler:   reflect.TypeFor[testMarshaler](),
	Unmarshaler: reflect.TypeFor[testUnmarshaler](),
	Marshal:     func(e *Encoder, p any) error { return p.(testMarshaler).MarshalTest(e) },
	Unmarshal:   func(d *Decoder, p any) error { return p.(testUnmarshaler).UnmarshalTest(d) },
}

// selfCoded writes its fields by hand, and a tensor.
type selfCoded struct {
	N uint64
	S string
	T *tensor.Dense
}

func (s *selfCoded) MarshalTest(e *Encoder) error {
	e.Uvarint(s.N)
	e.String(s.S)
	return e.Tensor(s.T)
}

func (s *selfCoded) UnmarshalTest(d *Decoder) error {
	var err error
	if s.N, err = d.Uvarint(); err != nil {
		return err
	}
	if s.S, err = d.String(); err != nil {
		return err
	}
	s.T, err = d.Tensor()
	return err
}

// later carries a value decoded later (as rpc.Any does).
type later struct {
	v any
	d Deferred
}

func (l *later) MarshalTest(e *Encoder) error {
	d := l.d
	if l.v != nil {
		var err error
		if d, err = e.EncodeDeferred(l.v); err != nil {
			return err
		}
	}
	return e.WriteDeferred(d)
}

func (l *later) UnmarshalTest(d *Decoder) error {
	v, err := d.ReadDeferred()
	l.d = v
	return err
}

type inner struct {
	A int8
	B []string
	T *tensor.Dense
	//lint:ignore U1000 an unexported field, which the codec must skip
	skip int
	Hide int `rpc:"-"`
}

type outer struct {
	I     int
	I16   int16
	U     uint64
	U8    uint8
	F32   float32
	F64   float64
	C64   complex64
	C     complex128
	S     string
	Bs    []byte
	Bools []bool
	Arr   [3]int16
	M     map[string]*inner
	MI    map[int32]float64
	P     *inner
	NilP  *inner
	Ts    []*tensor.Dense
	Iface any
	Nest  [][]float64
	Empty struct{}
	Es    []struct{}
	Self  selfCoded
	Selfs []selfCoded
	Later later
	PP    **int
}

// samples are real values of the types the fuzz target decodes into, one
// of each, whose encodings seed it.
func samples() []any {
	x := dense([]int{2}, []float64{1, 2})
	y := dense([]int{2, 2}, []uint8{1, 2, 3, 4})
	seven := 7
	p7 := &seven
	return []any{
		outer{
			I: -7, I16: -300, U: 1 << 60, U8: 200, F32: 1.5, F64: -2.25, C64: complex(1, 2), C: complex(1, -1), S: "héllo",
			Bs: []byte{0, 1, 2}, Bools: []bool{true, false}, Arr: [3]int16{-1, 0, 1},
			M: map[string]*inner{"x": {A: 3, B: []string{"a", ""}, T: y}}, MI: map[int32]float64{-1: 0.5},
			P: &inner{A: -1, T: x}, Ts: []*tensor.Dense{x, nil, y}, Iface: y, Nest: [][]float64{{1}, nil, {}},
			Es: make([]struct{}, 3), Self: selfCoded{N: 9, S: "self", T: x}, Selfs: []selfCoded{{N: 1}, {S: "two", T: y}},
			Later: later{v: []int{4, 5}}, PP: &p7,
		},
		[]string{"a", "b", ""},
		map[int]string{1: "one", -2: "minus two"},
		[]*inner{{A: 1, T: x}, nil},
		[2][]int64{{1, 2}, nil},
		x,
		[][64]float64{{1}, {2, 3}},
		map[[2]int32][]selfCoded{{1, 2}: {{N: 3}}},
	}
}

// encode encodes v as a frame's payload and table.
func encode(t testing.TB, v any) (typ string, payload []byte, tensors []*tensor.Dense) {
	t.Helper()
	e := testCodec.NewEncoder(nil, Peer{Name: "w1", ID: 1})
	typ, err := e.EncodeTop(v)
	if err != nil {
		t.Fatalf("encode %T: %v", v, err)
	}
	return typ, e.Payload(), e.Tensors()
}

func TestValueRoundTrip(t *testing.T) {
	for _, v := range samples() {
		typ, payload, tensors := encode(t, v)
		if typ != reflect.TypeOf(v).String() {
			t.Fatalf("type name %q for a %T", typ, v)
		}
		got, err := testCodec.DecodeTop(reflect.TypeOf(v), typ, payload, tensors, Peer{})
		if err != nil {
			t.Fatalf("decode %T: %v", v, err)
		}
		_, again, _ := encode(t, got.Interface())
		if !bytes.Equal(again, payload) && reflect.TypeOf(v).Kind() != reflect.Map && reflect.TypeOf(v) != reflect.TypeFor[outer]() {
			t.Fatalf("%T re-encodes differently", v)
		}
	}
	o := samples()[0].(outer)
	typ, payload, tensors := encode(t, o)
	got, err := testCodec.DecodeTop(reflect.TypeFor[outer](), typ, payload, tensors, Peer{})
	if err != nil {
		t.Fatal(err)
	}
	out := got.Interface().(outer)
	if out.I != o.I || out.C64 != o.C64 || out.S != o.S || out.Arr != o.Arr || out.MI[-1] != 0.5 || **out.PP != 7 || len(out.Es) != 3 {
		t.Fatalf("scalars: %+v", out)
	}
	if out.Self.N != 9 || out.Self.S != "self" || out.Self.T != out.P.T || out.Ts[0] != out.P.T || !sameTensor(out.Ts[2], o.Ts[2]) {
		t.Fatalf("self-coded value and shared tensors: %+v", out.Self)
	}
	var ints []int
	if v, err := testCodec.DecodeDeferred(reflect.TypeFor[[]int](), out.Later.d); err != nil || !reflect.DeepEqual(v.Interface(), []int{4, 5}) {
		t.Fatalf("deferred value: %v %v", v, err)
	} else {
		ints = v.Interface().([]int)
	}
	if _, err := testCodec.DecodeDeferred(reflect.TypeFor[string](), out.Later.d); !errors.Is(err, ErrWrongType) {
		t.Fatalf("deferred value as the wrong type: %v (%v)", err, ints)
	}
}

// TestDecodeRefusesCountsBeforeAllocating: a count that the bytes left
// cannot hold is refused before the decoder allocates for it, however
// large the elements (a few bytes must not make the decoder allocate
// gigabytes).
func TestDecodeRefusesCountsBeforeAllocating(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, c := range []struct {
		want    reflect.Type
		payload []byte
	}{
		{reflect.TypeFor[[][1 << 20]byte](), append([]byte{201, 1}, make([]byte, 200)...)}, // 200 elements of a MiB in 202 bytes
		{reflect.TypeFor[[][4]float64](), append([]byte{11}, make([]byte, 32*9)...)},       // 10 elements, 9 elements' bytes
		{reflect.TypeFor[map[[64]int8]float64](), []byte{3, 1, 2}},
		{reflect.TypeFor[[]struct{}](), []byte{0xff, 0xff, 0xff, 0xff, 0x0f}},
	} {
		if _, err := testCodec.DecodeTop(c.want, c.want.String(), c.payload, nil, Peer{}); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", c.want, err)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("refusing the counts allocated %d bytes", n)
	}
	// Elements that take no bytes may still come by the thousand.
	v, err := testCodec.DecodeTop(reflect.TypeFor[[]struct{}](), "[]struct {}", []byte{0xe9, 0x07}, nil, Peer{})
	if err != nil || v.Len() != 1000 {
		t.Fatalf("1000 empty structs: %v", err)
	}
}

// FuzzDecodeValue feeds the value decoder, which reads what the network
// brings, with mutations of real encodings: it must return a value or an
// error, never panic or allocate without bound, and what it returns must
// encode again and decode to a value that encodes the same.
func FuzzDecodeValue(f *testing.F) {
	types := []reflect.Type{}
	for i, v := range samples() {
		types = append(types, reflect.TypeOf(v))
		_, payload, tensors := encode(f, v)
		f.Add(uint8(i), uint8(len(tensors)), payload)
	}
	f.Add(uint8(1), uint8(0), []byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(uint8(0), uint8(0), []byte{})
	table := []*tensor.Dense{dense([]int{2}, []float64{1, 2}), dense([]int{2, 2}, []uint8{1, 2, 3, 4}), dense([]int{1}, []int32{3})}
	f.Fuzz(func(t *testing.T, which, ntensors uint8, payload []byte) {
		want := types[int(which)%len(types)]
		tensors := table[:int(ntensors)%(len(table)+1)]
		v, err := testCodec.DecodeTop(want, want.String(), payload, tensors, Peer{})
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrWrongType) {
				t.Fatalf("decode error without a wire sentinel: %v", err)
			}
			return
		}
		if o, ok := v.Interface().(outer); ok {
			// The deferred value decodes (or fails) on demand, cleanly.
			for _, as := range types {
				if _, err := testCodec.DecodeDeferred(as, o.Later.d); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrWrongType) {
					t.Fatalf("deferred decode error without a wire sentinel: %v", err)
				}
			}
		}
		e := testCodec.NewEncoder(nil, Peer{})
		typ, err := e.EncodeTop(v.Interface())
		if err != nil {
			t.Fatalf("a decoded %s does not encode again: %v", want, err)
		}
		w, err := testCodec.DecodeTop(want, typ, e.Payload(), e.Sent(), Peer{})
		if err != nil {
			t.Fatalf("a re-encoded %s does not decode: %v", want, err)
		}
		if want.Kind() == reflect.Map || want == reflect.TypeFor[outer]() {
			return // map order differs from one encoding to the next
		}
		e2 := testCodec.NewEncoder(nil, Peer{})
		if _, err := e2.EncodeTop(w.Interface()); err != nil || !bytes.Equal(e2.Payload(), e.Payload()) {
			t.Fatalf("a %s changed on its second round trip (%v)", want, err)
		}
	})
}
