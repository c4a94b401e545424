package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"

	"github.com/tandemml/tandem/internal/errs"
)

// ErrFormat is wrapped by every error about a malformed safetensors file.
var ErrFormat = errors.New("checkpoint: malformed safetensors file")

// ErrMismatch is wrapped by every error about a well-formed file that does
// not fit the model it is loaded into (names, shapes, dtypes). It is a
// mismatch of the shared kind: errors.Is(err, comm.ErrMismatch) holds too.
var ErrMismatch = errs.Kind("checkpoint: file does not match the model", errs.Mismatch)

// MaxHeaderSize bounds the JSON header (100 MB, as the reference reader).
const MaxHeaderSize = 100 << 20

const metadataKey = "__metadata__"

// Entry is one tensor's record in a safetensors header.
type Entry struct {
	Name  string
	Dtype string // safetensors dtype: F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL
	Shape []int
	// Begin and End are byte offsets into the data buffer, which starts
	// right after the header.
	Begin, End int64
}

// Header is a parsed, validated safetensors header.
type Header struct {
	// Entries in the order their data lies in the buffer.
	Entries []Entry
	// Metadata is the optional "__metadata__" map (nil when absent),
	// less the ChecksumKey entry, which is in Checksum.
	Metadata map[string]string
	// Checksum is the metadata's ChecksumKey entry ("crc32c:" and 8 hex
	// digits), or "" when the file has none (files written by PyTorch or by
	// Tandem before checksums). ParseHeader checks its form only; Decode and
	// Verify check it against the file.
	Checksum string
	// DataStart is the file offset of the data buffer (8 + header length).
	DataStart int64
}

type rawEntry struct {
	Dtype       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// ParseHeader parses and validates the header of a safetensors file whose
// first bytes are prefix and whose total size is fileSize (prefix must hold
// at least the 8-byte length and the header). It checks that the header
// length is sane, the JSON is one object without duplicate keys, every
// tensor has a known dtype, a non-negative shape and offsets inside the
// buffer spanning exactly product(shape)·element size bytes, and that the
// tensors neither overlap nor leave holes in the buffer. A checksum in the
// metadata must be well formed, but ParseHeader does not read the data to
// check it (Verify and Decode do).
func ParseHeader(prefix []byte, fileSize int64) (*Header, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return nil, formatErr("file of %d bytes is too short for the 8-byte header length", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix[:8])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit: %w", ErrFormat, n, MaxHeaderSize, errs.TooLarge)
	}
	if int64(n) > fileSize-8 {
		return nil, formatErr("header length %d exceeds the %d bytes after the length field", n, fileSize-8)
	}
	if int64(len(prefix)) < 8+int64(n) {
		return nil, formatErr("header of %d bytes but only %d available", n, len(prefix)-8)
	}
	h := &Header{DataStart: 8 + int64(n)}
	bufLen := fileSize - h.DataStart
	raw := prefix[8 : 8+n]
	if len(bytes.TrimLeft(raw, " \t\r\n")) == 0 || bytes.TrimLeft(raw, " \t\r\n")[0] != '{' {
		return nil, formatErr("header is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{'
		return nil, formatErr("header JSON: %v", err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, formatErr("header JSON: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, formatErr("header JSON: expected a key, got %v", tok)
		}
		if seen[name] {
			return nil, formatErr("tensor %q appears twice in the header", name)
		}
		seen[name] = true
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, formatErr("header JSON at %q: %v", name, err)
		}
		if name == metadataKey {
			if h.Metadata, err = parseMetadata(val); err != nil {
				return nil, err
			}
			continue
		}
		e, err := parseEntry(name, val, bufLen)
		if err != nil {
			return nil, err
		}
		h.Entries = append(h.Entries, e)
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, formatErr("header JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, formatErr("header JSON: trailing data after the object")
	}
	sort.SliceStable(h.Entries, func(i, j int) bool {
		a, b := h.Entries[i], h.Entries[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	var at int64
	for i, e := range h.Entries {
		if e.Begin < at {
			return nil, formatErr("tensor %q (bytes [%d, %d)) overlaps tensor %q (bytes [%d, %d))",
				e.Name, e.Begin, e.End, h.Entries[i-1].Name, h.Entries[i-1].Begin, h.Entries[i-1].End)
		}
		if e.Begin > at {
			return nil, formatErr("bytes [%d, %d) of the data buffer before tensor %q belong to no tensor", at, e.Begin, e.Name)
		}
		at = e.End
	}
	if at != bufLen {
		return nil, formatErr("bytes [%d, %d) at the end of the data buffer belong to no tensor", at, bufLen)
	}
	if sum, ok := h.Metadata[ChecksumKey]; ok {
		if _, err := parseChecksum(sum); err != nil {
			return nil, err
		}
		h.Checksum = sum
		delete(h.Metadata, ChecksumKey)
		if len(h.Metadata) == 0 {
			h.Metadata = nil
		}
	}
	return h, nil
}

func parseMetadata(val json.RawMessage) (map[string]string, error) {
	var m map[string]string
	if err := json.Unmarshal(val, &m); err != nil || m == nil {
		return nil, formatErr("%q must be an object of strings: %s", metadataKey, truncate(val))
	}
	return m, nil
}

func parseEntry(name string, val json.RawMessage, bufLen int64) (Entry, error) {
	var r rawEntry
	dec := json.NewDecoder(bytes.NewReader(val))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Entry{}, formatErr("tensor %q: %v in %s", name, err, truncate(val))
	}
	info, ok := dtypes[r.Dtype]
	if !ok {
		return Entry{}, formatErr("tensor %q: unknown dtype %q", name, r.Dtype)
	}
	if r.Shape == nil {
		return Entry{}, formatErr("tensor %q: missing shape", name)
	}
	if len(r.DataOffsets) != 2 {
		return Entry{}, formatErr("tensor %q: data_offsets must be [begin, end], got %v", name, r.DataOffsets)
	}
	numel := int64(1)
	shape := make([]int, len(r.Shape))
	for i, d := range r.Shape {
		if d < 0 {
			return Entry{}, formatErr("tensor %q: negative dimension in shape %v", name, r.Shape)
		}
		if d > 0 && numel > math.MaxInt64/8/d {
			return Entry{}, formatErr("tensor %q: shape %v is too large", name, r.Shape)
		}
		numel *= d
		shape[i] = int(d)
	}
	begin, end := r.DataOffsets[0], r.DataOffsets[1]
	if begin < 0 || end < begin {
		return Entry{}, formatErr("tensor %q: invalid data_offsets [%d, %d]", name, begin, end)
	}
	if end > bufLen {
		return Entry{}, formatErr("tensor %q: data_offsets [%d, %d] run past the end of the %d-byte data buffer", name, begin, end, bufLen)
	}
	if want := numel * int64(info.size); end-begin != want {
		return Entry{}, formatErr("tensor %q: data_offsets [%d, %d] span %d bytes, but %s %v needs %d", name, begin, end, end-begin, r.Dtype, r.Shape, want)
	}
	return Entry{Name: name, Dtype: r.Dtype, Shape: shape, Begin: begin, End: end}, nil
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}
