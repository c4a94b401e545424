package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// checksummed saves a small file with two same-shaped tensors and metadata
// and returns its path and bytes.
func checksummed(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	ts := []Named{
		{"a", tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float32{1, 2, 3, 4}))},
		{"b", tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float32{5, 6, 7, 8}))},
		{"step", tensor.New(tensor.WithShape(), tensor.WithBacking([]int64{12}))},
	}
	if err := Save(path, ts, map[string]string{"epoch": "3", "format": "pt"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, data
}

// TestChecksumWritten checks that Save records a CRC-32C in the metadata as
// a plain string entry, which any safetensors reader accepts, and that Load
// verifies it and keeps it out of the user's metadata.
func TestChecksumWritten(t *testing.T) {
	path, data := checksummed(t)
	n := binary.LittleEndian.Uint64(data)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	var meta map[string]string // other readers require an object of strings
	if err := json.Unmarshal(hdr["__metadata__"], &meta); err != nil {
		t.Fatalf("__metadata__ is not an object of strings: %v", err)
	}
	sum := meta[ChecksumKey]
	if _, err := parseChecksum(sum); err != nil || !strings.HasPrefix(sum, "crc32c:") {
		t.Fatalf("metadata %v: checksum %q (%v)", meta, sum, err)
	}
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Checksum != sum {
		t.Errorf("File.Checksum %q, header %q", f.Checksum, sum)
	}
	if want := map[string]string{"epoch": "3", "format": "pt"}; !reflect.DeepEqual(f.Metadata, want) {
		t.Errorf("metadata %v, want %v", f.Metadata, want)
	}
	if h, err := Verify(data); err != nil || h.Checksum != sum {
		t.Errorf("Verify: %v, checksum %v", err, h)
	}
	// Saving a file's tensors with a stale checksum entry in the metadata
	// records a fresh one.
	meta[ChecksumKey] = "crc32c:00000000"
	meta["epoch"] = "4"
	if err := Save(path, f.Tensors, meta); err != nil {
		t.Fatal(err)
	}
	g, err := Load(path)
	if err != nil || g.Checksum == "crc32c:00000000" || g.Checksum == sum || g.Metadata["epoch"] != "4" {
		t.Errorf("re-saved with a stale checksum entry: %v, checksum %q, metadata %v", err, g.Checksum, g.Metadata)
	}
}

// TestChecksumCatchesDamage damages a saved file in the data, the tensor
// entries and the metadata, each in a way that leaves a well-formed file,
// and checks that loading it fails with ErrCorrupt naming the file, while
// the same damage to a file without a checksum goes unnoticed (what every
// file suffered before checksums).
func TestChecksumCatchesDamage(t *testing.T) {
	path, data := checksummed(t)
	n := int(binary.LittleEndian.Uint64(data))
	start := 8 + n
	replaceInHeader := func(old, new string) func([]byte) {
		return func(b []byte) {
			h := b[8 : 8+n]
			i := bytes.Index(h, []byte(old))
			if i < 0 || len(old) != len(new) {
				t.Fatalf("header %s lacks %q", h, old)
			}
			copy(h[i:], new)
		}
	}
	for _, c := range []struct {
		name   string
		inData bool // the damage is in the data buffer only
		damage func([]byte)
	}{
		{"first data byte flipped", true, func(b []byte) { b[start] ^= 0x01 }},
		{"a bit of the last byte flipped", true, func(b []byte) { b[len(b)-1] ^= 0x80 }},
		{"a float's sign flipped", true, func(b []byte) { b[start+7] ^= 0x80 }},
		{"tensor names swapped", false, func(b []byte) {
			replaceInHeader(`"a":`, `"x":`)(b)
			replaceInHeader(`"b":`, `"a":`)(b)
			replaceInHeader(`"x":`, `"b":`)(b)
		}},
		{"shape changed", false, replaceInHeader(`"shape":[2,2]`, `"shape":[1,4]`)},
		{"metadata edited", false, replaceInHeader(`"epoch":"3"`, `"epoch":"9"`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := bytes.Clone(data)
			c.damage(bad)
			if _, err := ParseHeader(bad, int64(len(bad))); err != nil {
				t.Fatalf("the damage left a malformed file (%v); want one only the checksum catches", err)
			}
			p := filepath.Join(t.TempDir(), "damaged.safetensors")
			if err := os.WriteFile(p, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "checksum") {
				t.Errorf("Load: %v, want ErrCorrupt naming %s and the checksum", err, p)
			}
			if _, err := Verify(bad); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify: %v, want ErrCorrupt", err)
			}
			if !c.inData {
				return
			}
			// The same data damaged in the file without its checksum loads.
			plain := withoutChecksum(t, data)
			pn := int(binary.LittleEndian.Uint64(plain))
			f, err := Decode(append(bytes.Clone(plain[:8+pn]), bad[start:]...))
			if err != nil || f.Checksum != "" {
				t.Errorf("unchecked file with the same damage: %v, checksum %q; want it loaded unchecked", err, f.Checksum)
			}
		})
	}
	// Untouched, it loads.
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
	// A checksum entry that is not one is a format error.
	bad := bytes.Clone(data)
	i := bytes.Index(bad[8:8+n], []byte(`"crc32c:`)) + 8
	copy(bad[i:], `"crc32x:`)
	if _, err := Decode(bad); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), ChecksumKey) {
		t.Errorf("malformed checksum entry: %v, want ErrFormat naming %s", err, ChecksumKey)
	}
}

// TestNoChecksumStillLoads loads files without a checksum: the PyTorch-made
// fixture and a Tandem file stripped of its entry.
func TestNoChecksumStillLoads(t *testing.T) {
	for _, name := range []string{"init.safetensors", "data.safetensors"} {
		path := filepath.Join(fixtureDir(), name)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(ChecksumKey)) {
			t.Fatalf("%s has a checksum; the test needs a file written by PyTorch", path)
		}
		f, err := Load(path)
		if err != nil || f.Checksum != "" || len(f.Tensors) == 0 {
			t.Fatalf("%s: %v (checksum %q)", path, err, f.Checksum)
		}
	}
	_, data := checksummed(t)
	f, err := Decode(withoutChecksum(t, data))
	if err != nil || f.Checksum != "" || f.Metadata["epoch"] != "3" {
		t.Fatalf("stripped file: %v, %+v", err, f)
	}
}

// TestChecksumLargeFile checks a file large enough for Decode to verify it
// alongside the decoding: damage is reported as ErrCorrupt, also when it
// makes decoding itself fail first (a BOOL byte that is neither 0 nor 1).
func TestChecksumLargeFile(t *testing.T) {
	n := parallelCheckBytes/4 + 1000
	big := make([]float32, n)
	for i := range big {
		big[i] = float32(i)
	}
	ts := []Named{
		{"flags", tensor.New(tensor.WithShape(4), tensor.WithBacking([]bool{true, false, true, true}))},
		{"w", tensor.New(tensor.WithShape(n), tensor.WithBacking(big))},
	}
	var buf bytes.Buffer
	if err := Encode(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	h, err := ParseHeader(data, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if len(data)-int(h.DataStart) < parallelCheckBytes {
		t.Fatalf("data of %d bytes is under %d", len(data)-int(h.DataStart), parallelCheckBytes)
	}
	f, err := Decode(data)
	if err != nil || f.Checksum == "" {
		t.Fatalf("intact: %v, checksum %q", err, f.Checksum)
	}
	w, _ := f.Get("w")
	if w.Float32s()[n-1] != float32(n-1) {
		t.Errorf("last element %v", w.Float32s()[n-1])
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)-3] ^= 0x20
	if _, err := Decode(flipped); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flipped byte: %v, want ErrCorrupt", err)
	}
	badBool := bytes.Clone(data)
	badBool[h.DataStart+1] = 7
	if _, err := Decode(badBool); !errors.Is(err, ErrCorrupt) {
		t.Errorf("damaged BOOL byte: %v, want ErrCorrupt rather than a decoding error", err)
	}
	if _, err := Decode(withoutChecksum(t, badBool)); !errors.Is(err, ErrFormat) {
		t.Errorf("damaged BOOL byte without a checksum: %v, want ErrFormat", err)
	}
}
