package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/recvbuf"
)

func encodeFrame(t testing.TB, f *Frame) []byte {
	head, _, err := AppendHead(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	bufs := Buffers(head, f)
	bufs.WriteTo(&b)
	return b.Bytes()
}

func TestFrameRoundTrip(t *testing.T) {
	f := &Frame{Kind: KindRequest, ID: 77, Fn: "echo", Type: "*tensor.Dense", Aux: 5e9,
		Meta: map[string]string{"a": "b", "autograd": "12"}, Payload: []byte{1, 2, 3},
		Tensors: []*tensor.Dense{dense([]int{2, 2}, []float32{1, 2, 3, 4}), tensor.New(tensor.FromScalar(int64(7)))}}
	g, err := DecodeFrame(encodeFrame(t, f), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.Kind != f.Kind || g.ID != f.ID || g.Fn != f.Fn || g.Type != f.Type || g.Aux != f.Aux || !reflect.DeepEqual(g.Meta, f.Meta) || !bytes.Equal(g.Payload, f.Payload) {
		t.Fatalf("fields: %+v", g)
	}
	if len(g.Tensors) != 2 || !sameTensor(g.Tensors[0], f.Tensors[0]) || g.Tensors[1].ScalarValue().(int64) != 7 {
		t.Fatalf("Tensors: %v", g.Tensors)
	}
}

func TestFrameRejects(t *testing.T) {
	good := encodeFrame(t, &Frame{Kind: KindRequest, ID: 1, Fn: "f", Tensors: []*tensor.Dense{dense([]int{4}, []float32{1, 2, 3, 4})}})
	cases := map[string][]byte{}
	b := bytes.Clone(good)
	b[12] = 9
	cases["kind"] = b
	b = bytes.Clone(good)
	b[14] = 2
	cases["version"] = b
	b = bytes.Clone(good)
	binary.LittleEndian.PutUint64(b[4:12], 1<<40)
	cases["oversized data"] = b
	b = bytes.Clone(good)
	binary.LittleEndian.PutUint64(b[4:12], 15)
	cases["data length disagrees with the tensors"] = b
	b = bytes.Clone(good)
	binary.LittleEndian.PutUint32(b[0:4], binary.LittleEndian.Uint32(b[0:4])+1)
	cases["head length"] = b
	cases["truncated"] = good[:len(good)-1]
	cases["request without a name"] = encodeFrame(t, &Frame{Kind: KindRequest, ID: 1})
	b = bytes.Clone(good)
	b[15] = FlagNoAck
	cases["no-ack flag without by-reference tensors"] = b
	b = encodeFrame(t, &Frame{Kind: KindResponse, ID: 1, Flags: FlagByRef, Tensors: []*tensor.Dense{dense([]int{4}, []float32{1, 2, 3, 4})}})
	b[15] |= FlagNoAck
	cases["no-ack flag on a response"] = b
	b = bytes.Clone(good)
	b[15] = 16
	cases["unknown flag"] = b
	b = bytes.Clone(good)
	b[15] = FlagPushed
	cases["pushed flag without by-reference tensors"] = b
	b = encodeFrame(t, &Frame{Kind: KindResponse, ID: 1, Type: "x"})
	b[15] = FlagLent
	cases["lent flag on a response"] = b
	one := []*tensor.Dense{dense([]int{4}, []float32{1, 2, 3, 4})}
	cases["pushed frame, no landings"] = encodeFrame(t, &Frame{Kind: KindRequest, ID: 1, Fn: "f", Flags: FlagByRef | FlagPushed, Tensors: one, Push: Push{Token: 1}})
	cases["grant with tensors"] = encodeFrame(t, &Frame{Kind: KindGrant, ID: 1, Aux: 1 << 20, Payload: make([]byte, GrantLen), Tensors: one})
	cases["grant of the wrong length"] = encodeFrame(t, &Frame{Kind: KindGrant, ID: 1, Aux: 1 << 20, Payload: make([]byte, GrantLen-1)})
	cases["revoke with a body"] = encodeFrame(t, &Frame{Kind: KindRevoke, ID: 1, Payload: []byte{1}})
	cases["kind past the last"] = func() []byte { b := encodeFrame(t, &Frame{Kind: KindRevoked, ID: 1}); b[12]++; return b }()
	for name, b := range cases {
		_, err := DecodeFrame(b, 1<<20, fakeFetch)
		if err == nil {
			t.Errorf("%s: decoded", name)
			continue
		}
		if name == "oversized data" && !errors.Is(err, errs.TooLarge) {
			t.Errorf("%s: %v, want errs.TooLarge", name, err)
		}
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(encodeFrame(f, &Frame{Kind: KindRequest, ID: 1, Fn: "echo", Type: "*tensor.Dense", Tensors: []*tensor.Dense{dense([]int{2}, []float32{1, 2})}}))
	f.Add(encodeFrame(f, &Frame{Kind: KindError, Code: 1, ID: 2, Aux: 1, Payload: []byte("boom"), Meta: map[string]string{"k": "v"}}))
	f.Add(encodeFrame(f, &Frame{Kind: KindCancel, ID: 3}))
	f.Add(encodeFrame(f, &Frame{Kind: KindResponse, ID: 4, Type: "[]int", Payload: []byte{4, 2, 4, 6}}))
	f.Add(encodeFrame(f, &Frame{Kind: KindGrant, ID: 5, Code: 128, Aux: 1 << 20, Payload: make([]byte, GrantLen)}))
	f.Add(encodeFrame(f, &Frame{Kind: KindRevoke, ID: 5}))
	f.Add([]byte("TNDMRPC garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := DecodeFrame(b, 1<<16, fakeFetch)
		if err != nil {
			return
		}
		// A frame that decodes re-encodes to a frame that decodes the same.
		again, err := DecodeFrame(encodeFrame(t, g), 1<<16, fakeFetch)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if again.Kind != g.Kind || again.ID != g.ID || again.Fn != g.Fn || again.Type != g.Type || again.Aux != g.Aux ||
			!bytes.Equal(again.Payload, g.Payload) || len(again.Tensors) != len(g.Tensors) || len(again.Meta) != len(g.Meta) {
			t.Fatalf("round trip changed the frame: %+v vs %+v", g, again)
		}
		for i := range g.Tensors {
			if !sameTensor(g.Tensors[i], again.Tensors[i]) && !g.Tensors[i].Shape().Eq(again.Tensors[i].Shape()) {
				t.Fatalf("tensor %d changed", i)
			}
		}
	})
}

// fakeFetch stands in for a same-host copy in decoder tests: it fills the
// tensor with bytes derived from the address.
func fakeFetch(dst []byte, addr uint64) error {
	for i := range dst {
		dst[i] = byte(addr) + byte(i)
	}
	return nil
}

func TestFrameNoAckRequest(t *testing.T) {
	x := dense([]int{4}, []float32{1, 2, 3, 4})
	g, err := DecodeFrame(encodeFrame(t, &Frame{Kind: KindRequest, ID: 7, Fn: "f", Flags: FlagByRef | FlagNoAck, Tensors: []*tensor.Dense{x}}), 1<<20, fakeFetch)
	if err != nil {
		t.Fatal(err)
	}
	if g.Flags != FlagByRef|FlagNoAck || len(g.Tensors) != 1 || len(g.Tensors[0].Header.Raw) != 16 {
		t.Fatalf("decoded %+v", g)
	}
}

// landingsFake is a receiver's side of pushed tensors in decoder tests:
// memory granted under token 5, whose bytes from 100 on the sender has
// written (0xEE) or, when written is false, failed to, and the receiver
// copies the rest as fakeFetch would.
type landingsFake struct {
	mem      []byte
	written  bool
	received int
}

func (l *landingsFake) Land(token, size uint64) ([]byte, recvbuf.Block, error) {
	if token != 5 || size > uint64(len(l.mem)) {
		return nil, recvbuf.Block{}, Malformed("no grant %d for %d bytes", token, size)
	}
	return l.mem, recvbuf.Block{}, nil
}

func (l *landingsFake) Receive(token uint64, raw []byte, addr uint64) error {
	l.received++
	if token != 5 {
		return Malformed("no grant %d being received into", token)
	}
	met := len(raw)
	if l.written {
		met = 100
	}
	return fakeFetch(raw[:met], addr)
}

// TestFramePushed: a pushed tensor lands in the granted memory, filled by
// the Landings' Receive; other tensors of the frame arrive as usual; a push
// under another grant, or of a tensor the frame does not have, is refused.
func TestFramePushed(t *testing.T) {
	small := dense([]int{2}, []float32{1, 2})
	big := dense([]int{64}, make([]float32, 64))
	f := &Frame{Kind: KindResponse, ID: 3, Type: "x", Flags: FlagByRef | FlagPushed, Tensors: []*tensor.Dense{small, big}, Push: Push{Token: 5, Index: 1}}
	b := encodeFrame(t, f)
	addr := uint64(uintptr(unsafe.Pointer(&big.Header.Raw[0])))
	for _, written := range []bool{true, false} {
		land := &landingsFake{mem: make([]byte, 512), written: written}
		const sent = 0xEE // what the sender "wrote" from byte 100
		for i := 100; i < 256; i++ {
			land.mem[i] = sent
		}
		g, err := ReadFrame(bytes.NewReader(b), make([]byte, HeaderLen), 1<<20, nil, fakeFetch, nil, land)
		if err != nil {
			t.Fatal(err)
		}
		if g.Push != f.Push || land.received != 1 || len(g.Tensors) != 2 || g.Tensors[1].Shape()[0] != 64 {
			t.Fatalf("written %v: decoded %+v, received %d", written, g, land.received)
		}
		raw := g.Tensors[1].Header.Raw
		if &raw[0] != &land.mem[0] || len(raw) != 256 {
			t.Fatalf("written %v: the pushed tensor is not in the granted memory", written)
		}
		for i, v := range raw {
			want := byte(addr) + byte(i) // fetched
			if i >= 100 && written {
				want = sent
			}
			if v != want {
				t.Fatalf("written %v: byte %d is %#x, want %#x", written, i, v, want)
			}
		}
		if len(g.Tensors[0].Header.Raw) != 8 {
			t.Fatalf("the other tensor: %v", g.Tensors[0])
		}
	}
	for name, p := range map[string]Push{"another grant": {Token: 6, Index: 1}, "no such tensor": {Token: 5, Index: 2}} {
		f.Push = p
		_, err := ReadFrame(bytes.NewReader(encodeFrame(t, f)), make([]byte, HeaderLen), 1<<20, nil, fakeFetch, nil, &landingsFake{mem: make([]byte, 512)})
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}
