package torchstore

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"testing"
)

func sampleQueries() []query {
	return []query{
		{typ: qSet, key: "/k", value: []byte("v")},
		{typ: qSet, key: "", value: nil},
		{typ: qCompareSet, key: "/c", value: []byte("old"), desired: []byte("new")},
		{typ: qGet, key: "/k"},
		{typ: qAdd, key: "init/", delta: -3},
		{typ: qCheck, keys: []string{"/a", "/b"}},
		{typ: qWait, keys: nil},
		{typ: qNumKeys},
		{typ: qWatchKey, key: "/w"},
		{typ: qDeleteKey, key: "/d"},
	}
}

func TestQueryRoundTrip(t *testing.T) {
	var stream []byte
	for _, q := range sampleQueries() {
		stream = append(stream, encodeQuery(q)...)
	}
	r := bufio.NewReader(bytes.NewReader(stream))
	for i, want := range sampleQueries() {
		got, err := decodeQuery(r, limits{maxValue: 1 << 20}, i == 0)
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if !bytes.Equal(encodeQuery(got), encodeQuery(want)) {
			t.Fatalf("query %d decoded as %+v, want %+v", i, got, want)
		}
	}
	if _, err := decodeQuery(r, limits{maxValue: 1 << 20}, false); err != io.EOF {
		t.Fatalf("after the last query: %v, want io.EOF", err)
	}
}

// TestQueryBytesAsTorchSendsThem pins the encoding to bytes captured from a
// torch 1.13 client (SET "/key" "val", then ADD "init/" 1).
func TestQueryBytesAsTorchSendsThem(t *testing.T) {
	set := []byte{0, 4, 0, 0, 0, 0, 0, 0, 0, '/', 'k', 'e', 'y', 3, 0, 0, 0, 0, 0, 0, 0, 'v', 'a', 'l'}
	if got := encodeQuery(query{typ: qSet, key: "/key", value: []byte("val")}); !bytes.Equal(got, set) {
		t.Fatalf("SET encodes as % x, torch sends % x", got, set)
	}
	add := []byte{3, 5, 0, 0, 0, 0, 0, 0, 0, 'i', 'n', 'i', 't', '/', 1, 0, 0, 0, 0, 0, 0, 0}
	if got := encodeQuery(query{typ: qAdd, key: InitKey, delta: 1}); !bytes.Equal(got, add) {
		t.Fatalf("ADD encodes as % x, torch sends % x", got, add)
	}
	wait := []byte{5, 1, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, '/', 'k', 'e', 'y'}
	if got := encodeQuery(query{typ: qWait, keys: []string{"/key"}}); !bytes.Equal(got, wait) {
		t.Fatalf("WAIT encodes as % x, torch sends % x", got, wait)
	}
}

func TestParseCounter(t *testing.T) {
	for _, c := range []struct {
		in string
		n  int64
		ok bool
	}{
		{"0", 0, true},
		{"42", 42, true},
		{"-7", -7, true},
		{"+3", 3, true},
		{"  12", 12, true},
		{"12abc", 12, true}, // std::stoll stops at the first non-digit
		{"9223372036854775807", math.MaxInt64, true},
		{"-9223372036854775808", math.MinInt64, true},
		{"9223372036854775808", 0, false},
		{"-9223372036854775809", 0, false},
		{"99999999999999999999999", 0, false},
		{"", 0, false},
		{"abc", 0, false},
		{"-", 0, false},
		{" ", 0, false},
	} {
		n, ok := parseCounter([]byte(c.in))
		if n != c.n || ok != c.ok {
			t.Errorf("parseCounter(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.ok)
		}
	}
}

// FuzzDecodeQuery feeds the server's request decoder arbitrary bytes: it
// must never panic nor accept a field past its limit, and every query it accepts
// must encode back to the bytes it consumed.
func FuzzDecodeQuery(f *testing.F) {
	for _, q := range sampleQueries() {
		f.Add(encodeQuery(q))
	}
	f.Add([]byte{0, 0xCE, 0xF7, 0x85, 0x3C})
	f.Add([]byte{qWait, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{qSet, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{12})
	const maxValue = 4 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		r := bufio.NewReaderSize(src, 16)
		lim := limits{maxValue: maxValue}
		consumed := 0
		for first := true; ; first = false {
			q, err := decodeQuery(r, lim, first)
			if err != nil {
				if errors.Is(err, errNewerClient) && !first {
					t.Fatal("VALIDATE recognised past the first query")
				}
				return
			}
			enc := encodeQuery(q)
			if len(q.key) > maxValue || len(q.value) > maxValue || len(q.desired) > maxValue {
				t.Fatalf("accepted a field over the limit: %d %d %d", len(q.key), len(q.value), len(q.desired))
			}
			end := len(data) - src.Len() - r.Buffered()
			if !bytes.Equal(enc, data[consumed:end]) {
				t.Fatalf("query %+v re-encodes as % x, was read from % x", q, enc, data[consumed:end])
			}
			consumed = end
		}
	})
}
