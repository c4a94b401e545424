package checkpoint

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"gorgonia.org/tensor"
)

// Named is a tensor with its state_dict name.
type Named struct {
	Name   string
	Tensor *tensor.Dense
}

// File is a decoded safetensors file.
type File struct {
	// Tensors in the order their data lies in the file (for files this
	// package or PyTorch's state_dict writers produce: state_dict order).
	Tensors []Named
	// Metadata is the header's "__metadata__" (nil when absent), less the
	// ChecksumKey entry.
	Metadata map[string]string
	// Checksum is the file's ChecksumKey entry, which Decode verified, or ""
	// when the file has none (files written by PyTorch or older Tandem,
	// loaded unchecked).
	Checksum string
	// Dtypes maps each tensor name to its dtype in the file (F16 and BF16
	// tensors decode to float32, so the tensor's dtype does not say).
	Dtypes map[string]string
	index  map[string]int
}

// Get returns the tensor called name.
func (f *File) Get(name string) (*tensor.Dense, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return f.Tensors[i].Tensor, true
}

// Names returns the tensor names in file order.
func (f *File) Names() []string {
	out := make([]string, len(f.Tensors))
	for i, t := range f.Tensors {
		out[i] = t.Name
	}
	return out
}

// Map returns the tensors by name.
func (f *File) Map() map[string]*tensor.Dense {
	out := make(map[string]*tensor.Dense, len(f.Tensors))
	for _, t := range f.Tensors {
		out[t.Name] = t.Tensor
	}
	return out
}

// Load reads and decodes the safetensors file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	f, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return f, nil
}

// parallelCheckBytes is the data size from which Decode verifies the
// checksum alongside the decoding rather than before it.
const parallelCheckBytes = 16 << 20

// Decode decodes a whole safetensors file held in data. The tensors own
// their memory (nothing aliases data). Zero-element tensors are refused:
// gorgonia's tensors cannot be empty. A file with a checksum (ChecksumKey)
// is verified first: a mismatch gives an error wrapping ErrCorrupt. A file
// without one is decoded unchecked.
func Decode(data []byte) (*File, error) {
	h, err := ParseHeader(data, int64(len(data)))
	if err != nil {
		return nil, err
	}
	buf := data[h.DataStart:]
	f := &File{Metadata: h.Metadata, Checksum: h.Checksum, Dtypes: map[string]string{}, index: map[string]int{}}
	// A large file's checksum is computed on another goroutine while the
	// tensors are decoded (with a core to spare, checking then costs no
	// time); nothing decoded escapes before it is compared. A small file's
	// is checked first: a goroutine would cost more than it saves.
	var checked chan error
	switch {
	case h.Checksum == "":
	case len(buf) < parallelCheckBytes:
		if err := verify(h, data); err != nil {
			return nil, err
		}
	default:
		checked = make(chan error, 1)
		go func() { checked <- verify(h, data) }()
	}
	for _, e := range h.Entries {
		t, err := decodeTensor(e, buf[e.Begin:e.End])
		if err != nil {
			// A damaged file is better reported as such than by whatever
			// its damage makes decoding trip on.
			if checked != nil {
				if cerr := <-checked; cerr != nil {
					return nil, cerr
				}
			}
			return nil, err
		}
		f.index[e.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, Named{Name: e.Name, Tensor: t})
		f.Dtypes[e.Name] = e.Dtype
	}
	if checked != nil {
		if err := <-checked; err != nil {
			return nil, err
		}
	}
	return f, nil
}

func decodeTensor(e Entry, b []byte) (*tensor.Dense, error) {
	info := dtypes[e.Dtype]
	n := len(b) / info.size
	if n == 0 {
		return nil, formatErr("tensor %q: shape %v has no elements, which this package cannot represent", e.Name, e.Shape)
	}
	le := binary.LittleEndian
	var backing any
	switch e.Dtype {
	case "F64":
		d := make([]float64, n)
		for i := range d {
			d[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
		backing = d
	case "F32":
		d := make([]float32, n)
		for i := range d {
			d[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
		backing = d
	case "F16":
		d := make([]float32, n)
		for i := range d {
			d[i] = halfToFloat32(le.Uint16(b[2*i:]))
		}
		backing = d
	case "BF16":
		d := make([]float32, n)
		for i := range d {
			d[i] = math.Float32frombits(uint32(le.Uint16(b[2*i:])) << 16)
		}
		backing = d
	case "I64":
		d := make([]int64, n)
		for i := range d {
			d[i] = int64(le.Uint64(b[8*i:]))
		}
		backing = d
	case "I32":
		d := make([]int32, n)
		for i := range d {
			d[i] = int32(le.Uint32(b[4*i:]))
		}
		backing = d
	case "I16":
		d := make([]int16, n)
		for i := range d {
			d[i] = int16(le.Uint16(b[2*i:]))
		}
		backing = d
	case "I8":
		d := make([]int8, n)
		for i := range d {
			d[i] = int8(b[i])
		}
		backing = d
	case "U64":
		d := make([]uint64, n)
		for i := range d {
			d[i] = le.Uint64(b[8*i:])
		}
		backing = d
	case "U32":
		d := make([]uint32, n)
		for i := range d {
			d[i] = le.Uint32(b[4*i:])
		}
		backing = d
	case "U16":
		d := make([]uint16, n)
		for i := range d {
			d[i] = le.Uint16(b[2*i:])
		}
		backing = d
	case "U8":
		backing = append([]uint8(nil), b...)
	case "BOOL":
		d := make([]bool, n)
		for i := range d {
			if b[i] > 1 {
				return nil, formatErr("tensor %q: BOOL byte %d at element %d is neither 0 nor 1", e.Name, b[i], i)
			}
			d[i] = b[i] == 1
		}
		backing = d
	default:
		return nil, formatErr("tensor %q: unknown dtype %q", e.Name, e.Dtype)
	}
	return tensor.New(tensor.WithShape(e.Shape...), tensor.WithBacking(backing)), nil
}

// halfToFloat32 converts an IEEE 754 binary16 value exactly.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: frac · 2^-24
		v := float32(frac) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | frac<<13)
}
