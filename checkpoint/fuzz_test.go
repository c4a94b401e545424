package checkpoint

import (
	"bytes"
	"encoding/binary"
	"testing"

	"gorgonia.org/tensor"
)

func FuzzParseHeader(f *testing.F) {
	var buf bytes.Buffer
	Encode(&buf, []Named{
		{"0.weight", tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))},
		{"0.bias", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{1, 2}))},
	}, map[string]string{"format": "pt"})
	f.Add(buf.Bytes())
	f.Add(withoutChecksum(f, buf.Bytes())) // mutations reach the decoder rather than the checksum
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(file(`{}`, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHeader(data, int64(len(data)))
		if err != nil {
			return
		}
		// Whatever passes validation tiles the buffer exactly and fits the file.
		n := binary.LittleEndian.Uint64(data)
		if h.DataStart != 8+int64(n) || h.DataStart > int64(len(data)) {
			t.Fatalf("data start %d for header length %d, file %d", h.DataStart, n, len(data))
		}
		var at int64
		for _, e := range h.Entries {
			if e.Begin != at || e.End < e.Begin {
				t.Fatalf("entry %q [%d,%d) does not continue at %d", e.Name, e.Begin, e.End, at)
			}
			at = e.End
		}
		if at != int64(len(data))-h.DataStart {
			t.Fatalf("entries cover %d of %d buffer bytes", at, int64(len(data))-h.DataStart)
		}
		// Decoding a valid header never panics.
		_, _ = Decode(data)
	})
}
