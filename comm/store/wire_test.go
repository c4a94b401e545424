package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	msgs := []message{
		{op: opHello, id: 1 << 60, num: protoVersion, keys: []string{protoMagic, "tok"}},
		{op: opSet, code: flagOnce, id: 7, keys: []string{"k"}, vals: [][]byte{{0, 1, 2}}},
		{op: opAdd, id: 8, num: -1 << 62, keys: []string{""}},
		{op: opMultiSet, id: 9, keys: []string{"a", "b"}, vals: [][]byte{{}, []byte("x")}},
		{op: opReply, code: codeTimeout, id: 10, vals: [][]byte{[]byte("timed out")}},
		{op: opNumKeys},
	}
	var stream []byte
	for i := range msgs {
		stream = appendFrame(stream, &msgs[i])
	}
	r := bytes.NewReader(stream)
	for i, want := range msgs {
		p, err := readFrame(r, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		got, err := decodeMessage(p)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !equalMessages(got, want) {
			t.Fatalf("frame %d: got %+v, want %+v", i, got, want)
		}
	}
	if _, err := readFrame(r, 1<<20); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestFrameErrors(t *testing.T) {
	hdr := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	if _, err := readFrame(bytes.NewReader(hdr(100)), 99); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := readFrame(bytes.NewReader(append(hdr(10), 1, 2)), 99); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated payload: %v", err)
	}
	if _, err := readFrame(bytes.NewReader([]byte{0, 0}), 99); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated header: %v", err)
	}
	if _, err := readFrame(bytes.NewReader(hdr(0)), 99); !errors.Is(err, errMalformed) {
		t.Fatalf("empty frame: %v", err)
	}
	for _, p := range [][]byte{
		{opSet},                         // truncated header
		{opSet, 0, 1, 0, 200, 1},        // key count beyond the payload
		{opSet, 0, 1, 0, 1, 5, 'a'},     // key length beyond the payload
		{0, 0, 1, 0, 0, 0},              // unknown op
		{opReply, numCodes, 1, 0, 0, 0}, // unknown status
		{opSet, 0, 1, 0, 0, 0, 0},       // trailing byte
		{opSet, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // varint overflow
	} {
		if _, err := decodeMessage(p); !errors.Is(err, errMalformed) {
			t.Errorf("decodeMessage(%v) = %v, want errMalformed", p, err)
		}
	}
}

func TestDecodedValuesDoNotOverlap(t *testing.T) {
	m := message{op: opMultiSet, id: 1, keys: []string{"a", "b"}, vals: [][]byte{[]byte("12"), []byte("34")}}
	f := appendFrame(nil, &m)
	got, err := decodeMessage(f[frameHeader:])
	if err != nil {
		t.Fatal(err)
	}
	_ = append(got.vals[0], 'X', 'X', 'X', 'X')
	if string(got.vals[1]) != "34" {
		t.Fatalf("appending to one decoded value changed the next: %q", got.vals[1])
	}
}

func equalMessages(a, b message) bool {
	norm := func(m message) message {
		if len(m.keys) == 0 {
			m.keys = nil
		}
		if len(m.vals) == 0 {
			m.vals = nil
		}
		for i, v := range m.vals {
			if v == nil {
				m.vals[i] = []byte{}
			}
		}
		return m
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// FuzzFrameDecode feeds arbitrary bytes to the frame reader and decoder: they
// must never panic, never accept a frame over the limit, and whatever they
// accept must encode back to the same bytes.
func FuzzFrameDecode(f *testing.F) {
	for _, m := range []message{
		{op: opHello, id: 3, num: protoVersion, keys: []string{protoMagic, "t"}},
		{op: opMultiGet, id: 1, num: 5000, keys: []string{"a", "bb"}},
		{op: opCompareSet, code: flagOnce, id: 2, keys: []string{"k"}, vals: [][]byte{nil, []byte("v")}},
		{op: opReply, code: codeOK, id: 4, num: 1},
	} {
		f.Add(appendFrame(nil, &m))
	}
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			p, err := readFrame(r, limit)
			if err != nil {
				return
			}
			if len(p) > limit {
				t.Fatalf("accepted a frame of %d bytes over the limit %d", len(p), limit)
			}
			m, err := decodeMessage(p)
			if err != nil {
				continue
			}
			_ = checkRequest(&m)
			again, err := decodeMessage(appendFrame(nil, &m)[frameHeader:])
			if err != nil {
				t.Fatalf("re-encoding %+v: %v", m, err)
			}
			if !equalMessages(m, again) {
				t.Fatalf("round trip changed %+v into %+v", m, again)
			}
		}
	})
}

func TestReadFrameLarge(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 500_000) // 5 MB, read in growing chunks
	m := message{op: opSet, id: 1, keys: []string{"k"}, vals: [][]byte{big}}
	p, err := readFrame(bytes.NewReader(appendFrame(nil, &m)), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeMessage(p)
	if err != nil || !bytes.Equal(got.vals[0], big) {
		t.Fatalf("large frame did not survive: %v", err)
	}
	f := appendFrame(nil, &m)
	if _, err := readFrame(bytes.NewReader(f[:3<<20]), 8<<20); err != io.ErrUnexpectedEOF {
		t.Fatalf("large truncated frame: %v", err)
	}
}
