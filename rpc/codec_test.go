package rpc

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/wire"
)

type inner struct {
	A    int8
	B    []string
	T    *tensor.Dense
	skip int
	Hide int `rpc:"-"`
}

type outer struct {
	I     int
	U     uint64
	F32   float32
	F64   float64
	C     complex128
	S     string
	Bs    []byte
	Bools []bool
	Arr   [3]int16
	M     map[string]*inner
	P     *inner
	NilP  *inner
	Ts    []*tensor.Dense
	Iface any
	Nest  [][]float64
	Empty struct{}
	Anys  []Any
}

// roundTrip encodes v as a frame, decodes the frame from bytes and decodes
// the value as type T.
func roundTrip[T any](t *testing.T, v any) T {
	t.Helper()
	enc := encodeValue(nil, WorkerInfo{}, v)
	if enc.err != nil {
		t.Fatalf("encode %T: %v", v, enc.err)
	}
	f := wire.Frame{Kind: wire.KindRequest, ID: 9, Fn: "f", Type: enc.typ, Payload: enc.enc.Payload(), Tensors: enc.enc.Sent()}
	head, _, err := wire.AppendHead(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	bufs := wire.Buffers(head, &f)
	bufs.WriteTo(&b)
	g, err := wire.DecodeFrame(b.Bytes(), 1<<30, nil)
	if err != nil {
		t.Fatalf("decode frame: %v", err)
	}
	rv, err := decodeTop(reflect.TypeFor[T](), g.Type, g.Payload, g.Tensors, wire.Peer{})
	if err != nil {
		t.Fatalf("decode %T: %v", v, err)
	}
	out, _ := rv.Interface().(T)
	return out
}

func dense(shape []int, data any) *tensor.Dense {
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(data))
}

func sameTensor(a, b *tensor.Dense) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Dtype() == b.Dtype() && a.Shape().Eq(b.Shape()) && reflect.DeepEqual(a.Data(), b.Data())
}

func TestCodecRoundTrip(t *testing.T) {
	shared := dense([]int{2}, []float64{1, 2})
	in := outer{
		I: -7, U: 1 << 60, F32: 1.5, F64: -2.25, C: complex(1, -1), S: "héllo",
		Bs: []byte{0, 1, 2}, Bools: []bool{true, false, true}, Arr: [3]int16{-1, 0, 1},
		M:     map[string]*inner{"x": {A: 3, B: []string{"a", ""}, T: dense([]int{1, 2}, []int32{4, 5}), skip: 1, Hide: 2}},
		P:     &inner{A: -1, T: shared},
		Ts:    []*tensor.Dense{shared, nil, dense([]int{2, 2}, []uint8{1, 2, 3, 4})},
		Iface: dense([]int{1}, []float32{9}),
		Nest:  [][]float64{{1}, nil, {}},
		Anys:  []Any{AnyOf(3), AnyOf("s"), AnyOf(dense([]int{1}, []float32{2}))},
	}
	out := roundTrip[outer](t, in)
	if out.I != in.I || out.U != in.U || out.F32 != in.F32 || out.F64 != in.F64 || out.C != in.C || out.S != in.S ||
		!bytes.Equal(out.Bs, in.Bs) || !reflect.DeepEqual(out.Bools, in.Bools) || out.Arr != in.Arr {
		t.Fatalf("scalars: %+v", out)
	}
	got := out.M["x"]
	if got.A != 3 || !reflect.DeepEqual(got.B, []string{"a", ""}) || got.skip != 0 || got.Hide != 0 || !sameTensor(got.T, in.M["x"].T) {
		t.Fatalf("map value: %+v", got)
	}
	if out.NilP != nil || out.P.A != -1 || !sameTensor(out.P.T, shared) {
		t.Fatalf("pointers: %+v %+v", out.P, out.NilP)
	}
	if len(out.Ts) != 3 || out.Ts[1] != nil || !sameTensor(out.Ts[2], in.Ts[2]) || out.Ts[0] != out.P.T {
		t.Fatalf("tensor slice (the shared tensor must arrive once): %v", out.Ts)
	}
	if !sameTensor(out.Iface.(*tensor.Dense), in.Iface.(*tensor.Dense)) {
		t.Fatalf("interface field: %v", out.Iface)
	}
	if len(out.Nest) != 3 || out.Nest[1] != nil || out.Nest[2] == nil || out.Nest[0][0] != 1 {
		t.Fatalf("nested slices: %#v", out.Nest)
	}
	var n int
	var s string
	var x *tensor.Dense
	if err := out.Anys[0].Decode(&n); err != nil || n != 3 {
		t.Fatalf("Any int: %v %v", n, err)
	}
	if err := out.Anys[1].Decode(&s); err != nil || s != "s" {
		t.Fatalf("Any string: %v %v", s, err)
	}
	if err := out.Anys[2].Decode(&x); err != nil || x.Data().([]float32)[0] != 2 {
		t.Fatalf("Any tensor: %v %v", x, err)
	}
	if err := out.Anys[0].Decode(&s); !errors.Is(err, ErrWrongType) {
		t.Fatalf("Any decoded as the wrong type: %v", err)
	}
}

func TestCodecTensors(t *testing.T) {
	// Views and transposes travel as their logical contents.
	base := dense([]int{3, 4}, tensor.Range(tensor.Float64, 0, 12))
	view, err := base.Slice(nil, tensor.S(1, 3))
	if err != nil {
		t.Fatal(err)
	}
	got := roundTrip[*tensor.Dense](t, view.(*tensor.Dense))
	want := []float64{1, 2, 5, 6, 9, 10}
	if !reflect.DeepEqual(got.Data(), want) || !got.Shape().Eq(tensor.Shape{3, 2}) {
		t.Fatalf("view: %v %v", got.Shape(), got.Data())
	}
	tr := dense([]int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	if err := tr.T(); err != nil {
		t.Fatal(err)
	}
	got = roundTrip[*tensor.Dense](t, tr)
	if !reflect.DeepEqual(got.Data(), []float32{1, 4, 2, 5, 3, 6}) || !got.Shape().Eq(tensor.Shape{3, 2}) {
		t.Fatalf("transpose: %v %v", got.Shape(), got.Data())
	}
	sc := tensor.New(tensor.FromScalar(2.5))
	got = roundTrip[*tensor.Dense](t, sc)
	if !got.IsScalar() || got.ScalarValue().(float64) != 2.5 {
		t.Fatalf("scalar: %v", got)
	}
	empty := tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(0, 3))
	got = roundTrip[*tensor.Dense](t, empty)
	if !got.Shape().Eq(tensor.Shape{0, 3}) || got.Dtype() != tensor.Int64 {
		t.Fatalf("empty: %v %v", got.Shape(), got.Dtype())
	}
	for _, dt := range []tensor.Dtype{tensor.Bool, tensor.Int, tensor.Int8, tensor.Uint16, tensor.Complex64, tensor.Complex128} {
		x := tensor.New(tensor.Of(dt), tensor.WithShape(2, 2))
		got = roundTrip[*tensor.Dense](t, x)
		if got.Dtype() != dt || !got.Shape().Eq(x.Shape()) {
			t.Fatalf("dtype %v: got %v %v", dt, got.Dtype(), got.Shape())
		}
	}
	if got := roundTrip[*tensor.Dense](t, nil); got != nil {
		t.Fatalf("nil tensor: %v", got)
	}
}

func TestCodecRefusals(t *testing.T) {
	encodeTop := func(v any) (string, error) {
		e := encodeValue(nil, WorkerInfo{}, v)
		return e.typ, e.err
	}
	if _, err := encodeTop(struct{ C chan int }{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("channel: %v", err)
	}
	if _, err := encodeTop(struct{ X any }{X: 3}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("int in an interface: %v", err)
	}
	type node struct{ Next *node }
	n := &node{}
	n.Next = n
	if _, err := encodeTop(n); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("cycle: %v", err)
	}
	if _, err := decodeTop(reflect.TypeFor[int](), "string", nil, nil, wire.Peer{}); !errors.Is(err, ErrWrongType) {
		t.Fatalf("wrong type: %v", err)
	}
	// Truncated and inflated payloads fail cleanly.
	enc := encodeValue(nil, WorkerInfo{}, []string{"a", "b"})
	for i := 0; i < len(enc.enc.Payload()); i++ {
		if _, err := decodeTop(reflect.TypeFor[[]string](), enc.typ, enc.enc.Payload()[:i], nil, wire.Peer{}); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	if _, err := decodeTop(reflect.TypeFor[[]struct{}](), "[]struct {}", []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, nil, wire.Peer{}); err == nil {
		t.Fatal("a huge slice of empty structs decoded")
	}
}

func TestLargeReceivedTensors(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32, tensor.Int8, tensor.Bool, tensor.Complex128, tensor.Int} {
		n := 2*(64<<10)/int(dt.Size()) + 3 // past recvbuf's size for memory it does not zero
		x := tensor.New(tensor.Of(dt), tensor.WithShape(n))
		raw := x.Header.Raw
		for i := range raw {
			raw[i] = byte(i*7 + 1)
			if dt == tensor.Bool {
				raw[i] &= 1
			}
		}
		got := roundTrip[*tensor.Dense](t, x)
		if got.Dtype() != dt || !got.Shape().Eq(x.Shape()) || !bytes.Equal(got.Header.Raw, raw) {
			t.Fatalf("%v: got %v %v", dt, got.Dtype(), got.Shape())
		}
	}
}

// TestEncoderTensors: the encoder's list is the tensors a value carries,
// each once, in the order the encoder meets them (Any's included, a field
// that does not travel excluded), and the receiver's table holds them in
// that order.
func TestEncoderTensors(t *testing.T) {
	a := dense([]int{1}, []float32{1})
	b := dense([]int{2}, []float64{1, 2})
	c := dense([]int{1}, []int64{3})
	type value struct {
		X    *tensor.Dense
		List []*tensor.Dense
		M    map[string]*inner
		Any  Any
		I    any
		hide *tensor.Dense
		N    []float32
	}
	v := value{X: a, List: []*tensor.Dense{b, a, nil}, M: map[string]*inner{"k": {T: c}}, Any: AnyOf(&inner{T: b}), I: c, hide: dense([]int{1}, []float32{9})}
	enc := encodeValue(nil, WorkerInfo{}, v)
	if got := enc.enc.Tensors(); enc.err != nil || len(got) != 3 || got[0] != a || got[1] != b || got[2] != c {
		t.Fatalf("tensors of a value: %v (%v)", got, enc.err)
	}
	if e := encodeValue(nil, WorkerInfo{}, nil); len(e.enc.Tensors()) != 0 {
		t.Fatal("nil carries tensors")
	}
	if e := encodeValue(nil, WorkerInfo{}, a); len(e.enc.Tensors()) != 1 {
		t.Fatal("a tensor does not carry itself")
	}
	// Tensors in a map travel in the map's order of that encoding, which
	// the receiver's table keeps.
	m := map[int]*tensor.Dense{}
	for i := range 20 {
		m[i] = dense([]int{1}, []int64{int64(i)})
	}
	enc = encodeValue(nil, WorkerInfo{}, m)
	sent := enc.enc.Tensors()
	got := roundTrip[map[int]*tensor.Dense](t, m)
	f := wire.Frame{Kind: wire.KindRequest, ID: 1, Fn: "f", Type: enc.typ, Payload: enc.enc.Payload(), Tensors: enc.enc.Sent()}
	head, _, err := wire.AppendHead(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	bufs := wire.Buffers(head, &f)
	bufs.WriteTo(&buf)
	g, err := wire.DecodeFrame(buf.Bytes(), 1<<20, nil)
	if err != nil || len(g.Tensors) != len(sent) || len(got) != len(m) {
		t.Fatalf("frame: %v", err)
	}
	for i := range sent {
		if !sameTensor(sent[i], g.Tensors[i]) {
			t.Fatalf("tensor %d of the table differs: sent %v, received %v", i, sent[i].Data(), g.Tensors[i].Data())
		}
	}
}
