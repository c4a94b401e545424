package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// idxBytes encodes an IDX file of unsigned bytes.
func idxBytes(magic uint32, dims []int, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, magic)
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	w.Write(b)
	w.Close()
	return out.Bytes()
}

// writeSet writes n images of rows x cols (pixel (i, p) = (i*7+p) mod 256)
// and labels i mod 10 as name-images / name-labels in dir, gzipped or not.
func writeSet(t testing.TB, dir, images, labels string, n, rows, cols int, zip bool) (pix, lab []byte) {
	pix = make([]byte, n*rows*cols)
	for i := range pix {
		pix[i] = byte(i * 7)
	}
	lab = make([]byte, n)
	for i := range lab {
		lab[i] = byte(i % 10)
	}
	img := idxBytes(ImagesMagic, []int{n, rows, cols}, pix)
	lb := idxBytes(LabelsMagic, []int{n}, lab)
	if zip {
		img, lb = gz(img), gz(lb)
	}
	if err := os.WriteFile(filepath.Join(dir, images), img, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, labels), lb, 0o644); err != nil {
		t.Fatal(err)
	}
	return pix, lab
}

func TestLoadIDX(t *testing.T) {
	for _, zip := range []bool{false, true} {
		dir := t.TempDir()
		pix, lab := writeSet(t, dir, "img", "lab", 5, 3, 4, zip)
		ds, err := LoadIDX(filepath.Join(dir, "img"), filepath.Join(dir, "lab"))
		if err != nil {
			t.Fatal(err)
		}
		if ds.Len() != 5 || len(ds.Shape()) != 3 || ds.Shape()[0] != 1 || ds.Shape()[1] != 3 || ds.Shape()[2] != 4 {
			t.Fatalf("gzip=%v: %d examples of shape %v", zip, ds.Len(), ds.Shape())
		}
		x := make([]float32, 12)
		for i := 0; i < 5; i++ {
			y, err := ds.Get(i, x)
			if err != nil || y != int(lab[i]) {
				t.Fatalf("example %d: label %d, %v", i, y, err)
			}
			for p, v := range x {
				if want := float32(pix[i*12+p]) / 255; v != want {
					t.Fatalf("gzip=%v example %d pixel %d: %v, want %v", zip, i, p, v, want)
				}
			}
		}
		// Normalize and Flatten.
		nd, err := LoadIDX(filepath.Join(dir, "img"), filepath.Join(dir, "lab"), Normalize(0.5, 0.25), Flatten())
		if err != nil {
			t.Fatal(err)
		}
		if len(nd.Shape()) != 1 || nd.Shape()[0] != 12 {
			t.Fatalf("flattened shape %v", nd.Shape())
		}
		if got, want := nd.Features(2)[3], (float32(pix[2*12+3])/255-0.5)/0.25; got != want {
			t.Fatalf("normalised pixel %v, want %v", got, want)
		}
	}
}

func TestReadIDXRejects(t *testing.T) {
	good := idxBytes(LabelsMagic, []int{4}, []byte{1, 2, 3, 4})
	corrupt := gz(good)
	corrupt[len(corrupt)-6] ^= 0xff // inside the CRC-32 trailer
	for name, b := range map[string][]byte{
		"empty":          {},
		"short header":   {0, 0},
		"not IDX":        []byte("hello world, this is text"),
		"float type":     idxBytes(0x00000D01, []int{1}, []byte{0, 0, 0, 0}),
		"zero dims":      idxBytes(0x00000800, nil, nil),
		"truncated":      idxBytes(LabelsMagic, []int{10}, []byte{1, 2, 3}),
		"trailing bytes": append(idxBytes(LabelsMagic, []int{2}, []byte{1, 2}), 9),
		"huge dims":      idxBytes(ImagesMagic, []int{1 << 30, 1 << 10, 1 << 10}, nil),
		"gzip checksum":  corrupt,
		"gzip truncated": gz(good)[:20],
	} {
		if _, err := ReadIDX(bytes.NewReader(b)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if x, err := ReadIDX(bytes.NewReader(gz(good))); err != nil || x.Dims[0] != 4 || x.Data[3] != 4 {
		t.Fatalf("valid gzip file: %v %v", x, err)
	}
}

func TestNewIDXDatasetRejects(t *testing.T) {
	img := &IDX{Magic: ImagesMagic, Dims: []int{2, 2, 2}, Data: make([]byte, 8)}
	lab := &IDX{Magic: LabelsMagic, Dims: []int{2}, Data: []byte{0, 1}}
	for name, c := range map[string][2]*IDX{
		"swapped":         {lab, img},
		"count mismatch":  {img, {Magic: LabelsMagic, Dims: []int{3}, Data: []byte{0, 1, 2}}},
		"images as 2d":    {{Magic: 0x00000802, Dims: []int{2, 4}, Data: make([]byte, 8)}, lab},
		"nil":             {nil, lab},
		"zero-size image": {{Magic: ImagesMagic, Dims: []int{2, 0, 2}}, lab},
	} {
		if _, err := NewIDXDataset(c[0], c[1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := NewIDXDataset(img, lab, Normalize(0, 0)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("zero std: %v", err)
	}
	if _, err := NewIDXDataset(img, lab, Workers(2)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("loader option: %v", err)
	}
}

// FuzzReadIDX feeds arbitrary bytes (and their gzip) to the decoder: it must
// return a well-formed result or an error, never panic or over-allocate.
func FuzzReadIDX(f *testing.F) {
	f.Add(idxBytes(LabelsMagic, []int{3}, []byte{1, 2, 3}))
	f.Add(idxBytes(ImagesMagic, []int{1, 2, 2}, []byte{1, 2, 3, 4}))
	f.Add(gz(idxBytes(LabelsMagic, []int{1}, []byte{7})))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ReadIDX(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
			}
			return
		}
		n := 1
		for _, d := range x.Dims {
			n *= d
		}
		if n != len(x.Data) {
			t.Fatalf("dims %v but %d bytes", x.Dims, len(x.Data))
		}
	})
}
