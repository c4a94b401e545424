package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// Save writes tensors, in the given order, and metadata (may be nil) to a
// safetensors file at path, with a checksum (see ChecksumKey). The file is
// written to a temporary file in the same directory (see CleanTemps for its
// name) and renamed into place, so a crash never leaves a partial file at
// path; the temporary files of saves whose process died are removed first.
func Save(path string, tensors []Named, metadata map[string]string) error {
	dir := filepath.Dir(path)
	_, _ = CleanTemps(dir) // best effort: a failure here must not stop the save
	tmp, err := os.CreateTemp(dir, tempPattern(filepath.Base(path)))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := Encode(tmp, tensors, metadata); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if d, err := os.Open(dir); err == nil { // persist the rename; best effort
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// SaveMap is Save for a map; tensors are laid out in name order.
func SaveMap(path string, tensors map[string]*tensor.Dense, metadata map[string]string) error {
	return Save(path, sortedNamed(tensors), metadata)
}

func sortedNamed(m map[string]*tensor.Dense) []Named {
	out := make([]Named, 0, len(m))
	for k, v := range m {
		out = append(out, Named{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Encode writes tensors and metadata in safetensors format to w. The header
// lists the tensors in the given order and is padded with spaces so the data
// buffer starts at a multiple of 8 bytes. The metadata always holds a
// ChecksumKey entry, the checksum of the file's tensors and other metadata
// (a ChecksumKey entry in metadata is replaced).
func Encode(w io.Writer, tensors []Named, metadata map[string]string) error {
	seen := map[string]bool{}
	bufs := make([][]byte, len(tensors))
	entries := make([]Entry, len(tensors))
	var off int64
	for i, nt := range tensors {
		if nt.Name == "" || nt.Name == metadataKey {
			return fmt.Errorf("checkpoint: invalid tensor name %q: %w", nt.Name, errs.InvalidArgument)
		}
		if seen[nt.Name] {
			return fmt.Errorf("checkpoint: tensor %q given twice: %w", nt.Name, errs.InvalidArgument)
		}
		seen[nt.Name] = true
		if nt.Tensor == nil {
			return fmt.Errorf("checkpoint: tensor %q is nil: %w", nt.Name, errs.InvalidArgument)
		}
		dt, err := fileDtype(nt.Tensor.Dtype())
		if err != nil {
			return fmt.Errorf("checkpoint: tensor %q: %w", nt.Name, err)
		}
		b, err := encodeData(nt.Tensor)
		if err != nil {
			return fmt.Errorf("checkpoint: tensor %q: %w", nt.Name, err)
		}
		bufs[i] = b
		shape := []int(nt.Tensor.Shape())
		if nt.Tensor.IsScalar() {
			shape = []int{}
		}
		entries[i] = Entry{Name: nt.Name, Dtype: dt, Shape: shape, Begin: off, End: off + int64(len(b))}
		off += int64(len(b))
	}
	meta := make(map[string]string, len(metadata)+1)
	for k, v := range metadata {
		meta[k] = v
	}
	meta[ChecksumKey] = checksum(entries, metadata, bufs...)

	var hdr bytes.Buffer
	hdr.WriteByte('{')
	mb, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("checkpoint: metadata: %w", err)
	}
	hdr.WriteString(`"` + metadataKey + `":`)
	hdr.Write(mb)
	for _, e := range entries {
		eb, err := json.Marshal(rawEntry{Dtype: e.Dtype, Shape: toInt64s(e.Shape), DataOffsets: []int64{e.Begin, e.End}})
		if err != nil {
			return fmt.Errorf("checkpoint: tensor %q: %w", e.Name, err)
		}
		nb, _ := json.Marshal(e.Name)
		hdr.WriteByte(',')
		hdr.Write(nb)
		hdr.WriteByte(':')
		hdr.Write(eb)
	}
	hdr.WriteByte('}')
	for (8+hdr.Len())%8 != 0 {
		hdr.WriteByte(' ')
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(hdr.Len()))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, b := range bufs {
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return nil
}

func toInt64s(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}

// encodeData returns t's elements, row-major, little-endian.
func encodeData(t *tensor.Dense) ([]byte, error) {
	if t.RequiresIterator() || t.IsView() {
		m, ok := t.Materialize().(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("cannot materialise a view of shape %v", t.Shape())
		}
		t = m
	}
	le := binary.LittleEndian
	switch d := elems(t).(type) {
	case []float64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], math.Float64bits(v))
		}
		return b, nil
	case []float32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b, nil
	case []int64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], uint64(v))
		}
		return b, nil
	case []int:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], uint64(int64(v)))
		}
		return b, nil
	case []int32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], uint32(v))
		}
		return b, nil
	case []int16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], uint16(v))
		}
		return b, nil
	case []int8:
		b := make([]byte, len(d))
		for i, v := range d {
			b[i] = byte(v)
		}
		return b, nil
	case []uint64:
		b := make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(b[8*i:], v)
		}
		return b, nil
	case []uint32:
		b := make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(b[4*i:], v)
		}
		return b, nil
	case []uint16:
		b := make([]byte, 2*len(d))
		for i, v := range d {
			le.PutUint16(b[2*i:], v)
		}
		return b, nil
	case []uint8:
		return append([]byte(nil), d...), nil
	case []bool:
		b := make([]byte, len(d))
		for i, v := range d {
			if v {
				b[i] = 1
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("dtype %v has no safetensors encoding: %w", t.Dtype(), errs.InvalidArgument)
}
