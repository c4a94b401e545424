package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/models"
)

func TestRoundTripAllDtypes(t *testing.T) {
	in := []Named{
		{"f64", tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, -2, 3.5, math.Inf(1), 0, 1e-300}))},
		{"f32", tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{1.5, -0, float32(math.NaN())}))},
		{"i64", tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{math.MinInt64, 7}))},
		{"i32", tensor.New(tensor.WithShape(1, 2), tensor.WithBacking([]int32{-5, 1 << 30}))},
		{"u8", tensor.New(tensor.WithShape(4), tensor.WithBacking([]uint8{0, 1, 255, 9}))},
		{"bool", tensor.New(tensor.WithShape(2), tensor.WithBacking([]bool{true, false}))},
		{"i16", tensor.New(tensor.WithShape(1), tensor.WithBacking([]int16{-3}))},
		{"scalar", tensor.New(tensor.WithShape(), tensor.WithBacking([]int64{42}))},
	}
	path := filepath.Join(t.TempDir(), "rt.safetensors")
	meta := map[string]string{"format": "pt", "note": "round trip"}
	if err := Save(path, in, meta); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); (8+n)%8 != 0 {
		t.Errorf("data buffer starts at %d, not 8-aligned", 8+n)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Metadata, meta) {
		t.Errorf("metadata %v", f.Metadata)
	}
	if got := f.Names(); !reflect.DeepEqual(got, []string{"f64", "f32", "i64", "i32", "u8", "bool", "i16", "scalar"}) {
		t.Errorf("names in file order %v", got)
	}
	for _, nt := range in {
		got, ok := f.Get(nt.Name)
		if !ok {
			t.Fatalf("%s missing", nt.Name)
		}
		if got.Dtype() != nt.Tensor.Dtype() || !got.Shape().Eq(nt.Tensor.Shape()) {
			t.Errorf("%s: %v %v, want %v %v", nt.Name, got.Dtype(), got.Shape(), nt.Tensor.Dtype(), nt.Tensor.Shape())
		}
		a, b := encodeMust(t, got), encodeMust(t, nt.Tensor)
		if !bytes.Equal(a, b) { // bitwise, so NaN and -0 count
			t.Errorf("%s: data differs", nt.Name)
		}
	}
	// SaveMap lays out by name; no temp files are left behind.
	if err := SaveMap(path, f.Map(), nil); err != nil {
		t.Fatal(err)
	}
	g, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if g.Metadata != nil || g.Names()[0] != "bool" {
		t.Errorf("SaveMap: metadata %v names %v", g.Metadata, g.Names())
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries after saving, want 1", len(ents))
	}
}

func encodeMust(t *testing.T, d *tensor.Dense) []byte {
	t.Helper()
	b, err := encodeData(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSaveRejects(t *testing.T) {
	dir := t.TempDir()
	x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{1}))
	for name, ts := range map[string][]Named{
		"duplicate": {{"a", x}, {"a", x}},
		"empty":     {{"", x}},
		"reserved":  {{"__metadata__", x}},
		"nil":       {{"a", nil}},
		"complex":   {{"c", tensor.New(tensor.WithShape(1), tensor.WithBacking([]complex128{1}))}},
	} {
		if err := Save(filepath.Join(dir, name), ts, nil); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("%s: err %v, want InvalidArgument", name, err)
		}
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s: a file was left at the path", name)
		}
	}
}

func TestHalfPrecisionRead(t *testing.T) {
	// F16: 1.0=0x3c00, -2.0=0xc000, 65504=0x7bff, smallest subnormal 0x0001=2^-24, +inf 0x7c00
	// BF16: 1.0=0x3f80, -3.0=0xc040
	f16 := []uint16{0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00}
	bf16 := []uint16{0x3f80, 0xc040}
	var buf []byte
	for _, v := range append(f16, bf16...) {
		buf = binary.LittleEndian.AppendUint16(buf, v)
	}
	hdr := `{"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[10,14]}}`
	f, err := Decode(file(hdr, buf))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := f.Get("h")
	want := []float32{1, -2, 65504, float32(math.Ldexp(1, -24)), float32(math.Inf(1))}
	if !reflect.DeepEqual(h.Float32s(), want) {
		t.Errorf("F16 %v, want %v", h.Float32s(), want)
	}
	b, _ := f.Get("b")
	if !reflect.DeepEqual(b.Float32s(), []float32{1, -3}) || f.Dtypes["b"] != "BF16" {
		t.Errorf("BF16 %v", b.Float32s())
	}
}

// file assembles a safetensors file from a header and a data buffer.
func file(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestCorruptFiles(t *testing.T) {
	eight := make([]byte, 8)
	huge := binary.LittleEndian.AppendUint64(nil, 200<<20)
	huge = append(huge, make([]byte, 16)...)
	cases := []struct {
		name string
		data []byte
		msg  string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"header past end", append(binary.LittleEndian.AppendUint64(nil, 100), []byte("{}")...), "exceeds the 2 bytes"},
		{"header too large", huge, "exceeds the"},
		{"invalid json", file(`{"a":{"dtype":"F64",`, nil), "header JSON"},
		{"not an object", file(`[1,2]`, nil), "not a JSON object"},
		{"trailing", file(`{}{}`, nil), "trailing data"},
		{"duplicate", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, eight[:1]), `"a" appears twice`},
		{"unknown dtype", file(`{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, make([]byte, 16)), `tensor "a": unknown dtype "F128"`},
		{"unknown field", file(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8],"x":1}}`, eight), `tensor "a"`},
		{"past end", file(`{"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}`, eight), `tensor "w": data_offsets [0, 16] run past the end of the 8-byte data buffer`},
		{"wrong size", file(`{"w":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}`, eight), `tensor "w": data_offsets [0, 8] span 8 bytes, but F64 [2] needs 16`},
		{"overlap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "overlaps"},
		{"hole", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "belong to no tensor"},
		{"tail", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight), "at the end of the data buffer"},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, nil), "negative dimension"},
		{"offsets arity", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, nil), "data_offsets must be"},
		{"reversed", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, nil), "invalid data_offsets"},
		{"bad metadata", file(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"huge shape", file(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, eight), "too large"},
		{"bad bool", file(`{"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}`, []byte{7}), "neither 0 nor 1"},
		{"empty tensor", file(`{"a":{"dtype":"F64","shape":[0,3],"data_offsets":[0,0]}}`, nil), "no elements"},
	}
	for _, c := range cases {
		_, err := Decode(c.data)
		if err == nil {
			t.Errorf("%s: decoded without error", c.name)
			continue
		}
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %q, want ErrFormat mentioning %q", c.name, err, c.msg)
		}
	}
	if _, err := Decode(huge); !errors.Is(err, errs.TooLarge) {
		t.Errorf("oversized header: %v does not wrap TooLarge", err)
	}
	// Load names the file.
	path := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(path, []byte{1}, 0o644)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Load error %v does not name the file", err)
	}
}

func TestLoadIntoChecks(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	small, _ := models.NewMLP([]int{784, 128, 10}, models.WithRand(rng), models.WithDtype(tensor.Float64))
	big, _ := models.NewMLP([]int{784, 256, 10}, models.WithRand(rng), models.WithDtype(tensor.Float64))
	path := filepath.Join(dir, "big.safetensors")
	if err := SaveModule(path, big, nil); err != nil {
		t.Fatal(err)
	}
	before := append([]float64(nil), small.Params()[0].Value.Float64s()...)
	err := LoadInto(small, path)
	if !errors.Is(err, ErrMismatch) || !errors.Is(err, errs.Mismatch) || !strings.Contains(err.Error(), "parameter 0.weight: shape [256 784] in file, [128 784] in model") {
		t.Errorf("shape mismatch error: %v", err)
	}
	if !reflect.DeepEqual(before, small.Params()[0].Value.Float64s()) {
		t.Error("a failed load changed the model")
	}

	// dtype: float32 file into a float64 model needs ConvertFloats.
	f32, _ := models.NewMLP([]int{4, 3, 2}, models.WithActivation(models.ActTanh), models.WithRand(rng), models.WithDtype(tensor.Float32))
	f64, _ := models.NewMLP([]int{4, 3, 2}, models.WithActivation(models.ActTanh), models.WithRand(rng), models.WithDtype(tensor.Float64))
	p32 := filepath.Join(dir, "f32.safetensors")
	if err := SaveModule(p32, f32, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	err = LoadInto(f64, p32)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "parameter 0.weight: dtype F32 in file, float64 in model (use checkpoint.ConvertFloats() to convert)") {
		t.Errorf("dtype mismatch error: %v", err)
	}
	if err := LoadInto(f64, p32, ConvertFloats()); err != nil {
		t.Fatal(err)
	}
	for i, p := range f64.Params() {
		for j, v := range p.Value.Float64s() {
			if v != float64(f32.Params()[i].Value.Float32s()[j]) {
				t.Fatalf("%s[%d] = %v after conversion", p.Name, j, v)
			}
		}
	}

	// missing / unexpected entries
	other, _ := models.NewMLP([]int{4, 3}, models.WithActivation(models.ActTanh), models.WithRand(rng), models.WithDtype(tensor.Float64))
	err = LoadInto(other, p32, ConvertFloats())
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "not in the model: 2.weight, 2.bias") {
		t.Errorf("unexpected-entries error: %v", err)
	}
	if err := LoadInto(other, p32, NonStrict(), ConvertFloats()); err != nil {
		t.Errorf("NonStrict load: %v", err)
	}
	deeper, _ := models.NewMLP([]int{4, 3, 2, 2}, models.WithActivation(models.ActTanh), models.WithRand(rng), models.WithDtype(tensor.Float32))
	if err := LoadInto(deeper, p32); err == nil || !strings.Contains(err.Error(), "missing from the file: 4.weight, 4.bias") {
		t.Errorf("missing-entries error: %v", err)
	}
}

// Buffers (float running statistics and the int64 scalar
// num_batches_tracked) round-trip with the parameters, in state_dict order.
func TestModuleWithBuffersRoundTrip(t *testing.T) {
	mk := func() *models.Sequential {
		conv, _ := models.NewConv2d(1, 2, 3, models.WithRand(rand.New(rand.NewPCG(1, 1))), models.WithDtype(tensor.Float64))
		bn, _ := models.NewBatchNorm2d(2, models.WithDtype(tensor.Float64))
		return models.NewSequential(conv, bn)
	}
	src := mk()
	sd := models.StateDict(src)
	sd[4].Value.Float64s()[1] = 0.5 // 1.running_mean
	sd[5].Value.Float64s()[0] = 2.5 // 1.running_var
	sd[6].Value.Set(0, int64(7))    // 1.num_batches_tracked
	path := filepath.Join(t.TempDir(), "bn.safetensors")
	if err := SaveModule(path, src, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
	if !reflect.DeepEqual(f.Names(), want) || f.Dtypes["1.num_batches_tracked"] != "I64" {
		t.Errorf("file entries %v %v", f.Names(), f.Dtypes)
	}
	dst := mk()
	if err := LoadInto(dst, path); err != nil {
		t.Fatal(err)
	}
	for i, p := range models.StateDict(dst) {
		if !reflect.DeepEqual(p.Value.Data(), sd[i].Value.Data()) {
			t.Errorf("%s: %v after load, want %v", p.Name, p.Value.Data(), sd[i].Value.Data())
		}
	}
}

// withoutChecksum rewrites a safetensors file without its ChecksumKey
// metadata entry, as PyTorch or an older Tandem would have written it.
func withoutChecksum(t testing.TB, data []byte) []byte {
	t.Helper()
	h, err := ParseHeader(data, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if h.Checksum == "" {
		t.Fatal("the file has no checksum to remove")
	}
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	if h.Metadata != nil {
		mb, _ := json.Marshal(h.Metadata)
		hdr.WriteString(`"__metadata__":`)
		hdr.Write(mb)
	}
	for i, e := range h.Entries {
		if i > 0 || h.Metadata != nil {
			hdr.WriteByte(',')
		}
		nb, _ := json.Marshal(e.Name)
		eb, _ := json.Marshal(map[string]any{"dtype": e.Dtype, "shape": e.Shape, "data_offsets": []int64{e.Begin, e.End}})
		hdr.Write(nb)
		hdr.WriteByte(':')
		hdr.Write(eb)
	}
	hdr.WriteByte('}')
	return append(file(hdr.String(), nil), data[h.DataStart:]...)
}
