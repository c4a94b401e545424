package rpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"gorgonia.org/tensor"
)

func encodeFrame(t testing.TB, f *frame) []byte {
	head, _, err := appendHead(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	bufs := frameBuffers(head, f)
	bufs.WriteTo(&b)
	return b.Bytes()
}

func TestFrameRoundTrip(t *testing.T) {
	f := &frame{kind: kindRequest, id: 77, fn: "echo", typ: "*tensor.Dense", aux: 5e9,
		meta: Metadata{"a": "b", "autograd": "12"}, payload: []byte{1, 2, 3},
		tensors: []*tensor.Dense{dense([]int{2, 2}, []float32{1, 2, 3, 4}), tensor.New(tensor.FromScalar(int64(7)))}}
	g, err := decodeFrame(encodeFrame(t, f), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.kind != f.kind || g.id != f.id || g.fn != f.fn || g.typ != f.typ || g.aux != f.aux || !reflect.DeepEqual(g.meta, f.meta) || !bytes.Equal(g.payload, f.payload) {
		t.Fatalf("fields: %+v", g)
	}
	if len(g.tensors) != 2 || !sameTensor(g.tensors[0], f.tensors[0]) || g.tensors[1].ScalarValue().(int64) != 7 {
		t.Fatalf("tensors: %v", g.tensors)
	}
}

func TestFrameRejects(t *testing.T) {
	good := encodeFrame(t, &frame{kind: kindRequest, id: 1, fn: "f", tensors: []*tensor.Dense{dense([]int{4}, []float32{1, 2, 3, 4})}})
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
	cases["request without a name"] = encodeFrame(t, &frame{kind: kindRequest, id: 1})
	b = bytes.Clone(good)
	b[15] = flagNoAck
	cases["no-ack flag without by-reference tensors"] = b
	b = encodeFrame(t, &frame{kind: kindResponse, id: 1, flags: flagByRef, tensors: []*tensor.Dense{dense([]int{4}, []float32{1, 2, 3, 4})}})
	b[15] |= flagNoAck
	cases["no-ack flag on a response"] = b
	b = bytes.Clone(good)
	b[15] = 8
	cases["unknown flag"] = b
	for name, b := range cases {
		_, err := decodeFrame(b, 1<<20, fakeFetch)
		if err == nil {
			t.Errorf("%s: decoded", name)
			continue
		}
		if name == "oversized data" && !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v, want ErrTooLarge", name, err)
		}
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(encodeFrame(f, &frame{kind: kindRequest, id: 1, fn: "echo", typ: "*tensor.Dense", tensors: []*tensor.Dense{dense([]int{2}, []float32{1, 2})}}))
	f.Add(encodeFrame(f, &frame{kind: kindError, code: byte(codeRemote), id: 2, aux: 1, payload: []byte("boom"), meta: Metadata{"k": "v"}}))
	f.Add(encodeFrame(f, &frame{kind: kindCancel, id: 3}))
	f.Add(encodeFrame(f, &frame{kind: kindResponse, id: 4, typ: "[]int", payload: []byte{4, 2, 4, 6}}))
	f.Add([]byte("TNDMRPC garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := decodeFrame(b, 1<<16, fakeFetch)
		if err != nil {
			return
		}
		// A frame that decodes re-encodes to a frame that decodes the same.
		again, err := decodeFrame(encodeFrame(t, g), 1<<16, fakeFetch)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if again.kind != g.kind || again.id != g.id || again.fn != g.fn || again.typ != g.typ || again.aux != g.aux ||
			!bytes.Equal(again.payload, g.payload) || len(again.tensors) != len(g.tensors) || len(again.meta) != len(g.meta) {
			t.Fatalf("round trip changed the frame: %+v vs %+v", g, again)
		}
		for i := range g.tensors {
			if !sameTensor(g.tensors[i], again.tensors[i]) && !g.tensors[i].Shape().Eq(again.tensors[i].Shape()) {
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
	g, err := decodeFrame(encodeFrame(t, &frame{kind: kindRequest, id: 7, fn: "f", flags: flagByRef | flagNoAck, tensors: []*tensor.Dense{x}}), 1<<20, fakeFetch)
	if err != nil {
		t.Fatal(err)
	}
	if g.flags != flagByRef|flagNoAck || len(g.tensors) != 1 || len(g.tensors[0].Header.Raw) != 16 {
		t.Fatalf("decoded %+v", g)
	}
}
