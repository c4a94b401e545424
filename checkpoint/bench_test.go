package checkpoint

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// benchFile encodes float32 tensors totalling about mb megabytes, shaped
// like a small CNN's state_dict and optimizer state.
func benchFile(b *testing.B, mb float64) []byte {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 1))
	n := int(mb * (1 << 20) / 4)
	var ts []Named
	for i := 0; n > 0; i++ {
		k := min(n, 1<<20)
		d := make([]float32, k)
		for j := range d {
			d[j] = rng.Float32()
		}
		ts = append(ts, Named{fmt.Sprintf("t%d.weight", i), tensor.New(tensor.WithShape(k), tensor.WithBacking(d))})
		n -= k
	}
	var buf bytes.Buffer
	if err := Encode(&buf, ts, map[string]string{"format": "pt"}); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkDecode measures decoding a 1.7 MB file, the size of
// ddp_fashion's checkpoints, and a 256 MB one: "checked" as Save writes
// them (the checksum verified while decoding), "unchecked" the same file
// without its checksum entry (as PyTorch writes them; the decoding cost
// alone).
func BenchmarkDecode(b *testing.B) {
	for _, mb := range []float64{1.7, 256} {
		data := benchFile(b, mb)
		for _, kind := range []string{"unchecked", "checked"} {
			b.Run(fmt.Sprintf("%gMB/%s", mb, kind), func(b *testing.B) {
				data := data
				if kind == "unchecked" {
					data = withoutChecksum(b, data)
				}
				b.SetBytes(int64(len(data)))
				b.ResetTimer()
				for b.Loop() {
					f, err := Decode(data)
					if err != nil {
						b.Fatal(err)
					}
					if (f.Checksum != "") != (kind == "checked") {
						b.Fatalf("checksum %q in a %s file", f.Checksum, kind)
					}
				}
			})
		}
	}
}

// BenchmarkVerify measures the checksum check alone (header parsing and
// the CRC-32C over the file), the cost Decode adds for a checksummed file.
func BenchmarkVerify(b *testing.B) {
	for _, mb := range []float64{1.7, 256} {
		b.Run(fmt.Sprintf("%gMB", mb), func(b *testing.B) {
			data := benchFile(b, mb)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := Verify(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
