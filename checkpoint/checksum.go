package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
)

// ChecksumKey is the "__metadata__" entry in which Save and Encode record a
// checksum of the file, "crc32c:" followed by 8 lowercase hex digits. The
// entry is a string like any other metadata, so other safetensors readers
// (Python's safetensors, PyTorch) load the file as before and ignore it.
//
// The CRC-32C (Castagnoli) covers every tensor's name, dtype, shape and
// byte offsets, every other metadata entry, and the whole data buffer, so a
// flipped data byte, a tensor renamed or moved in the header and an edited
// metadata value are all caught. It guards against damage (bad disks,
// truncated copies, bit flips in transfer), not against tampering: anyone
// who can change the file can recompute it.
const ChecksumKey = "tandem.checksum"

// ErrCorrupt is wrapped by the error for a file whose contents do not match
// the checksum recorded in it when it was written.
var ErrCorrupt = errors.New("checkpoint: file does not match its checksum")

const checksumPrefix = "crc32c:"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum returns the CRC-32C of entries (in data order), metadata (less
// ChecksumKey) and the data buffer (bufs, in order), as the metadata value
// ChecksumKey holds.
func checksum(entries []Entry, meta map[string]string, bufs ...[]byte) string {
	crc := headerCRC(entries, meta)
	for _, b := range bufs {
		crc = crc32.Update(crc, castagnoli, b)
	}
	return formatChecksum(crc)
}

func formatChecksum(crc uint32) string { return fmt.Sprintf("%s%08x", checksumPrefix, crc) }

// headerCRC is the CRC-32C of entries and meta, which the data buffer's
// bytes then continue. They are described in a canonical form, independent
// of how the JSON header spells them:
//
//	tensors N
//	"name" DTYPE d0,d1,... begin end      (one line per tensor, Go-quoted name)
//	metadata M
//	"key"="value"                         (one line per entry, sorted by key)
//
// followed by the data buffer's bytes.
func headerCRC(entries []Entry, meta map[string]string) uint32 {
	var d bytes.Buffer
	fmt.Fprintf(&d, "tensors %d\n", len(entries))
	for _, e := range entries {
		d.WriteString(strconv.Quote(e.Name))
		d.WriteByte(' ')
		d.WriteString(e.Dtype)
		d.WriteByte(' ')
		for i, n := range e.Shape {
			if i > 0 {
				d.WriteByte(',')
			}
			d.WriteString(strconv.Itoa(n))
		}
		fmt.Fprintf(&d, " %d %d\n", e.Begin, e.End)
	}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		if k != ChecksumKey {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	fmt.Fprintf(&d, "metadata %d\n", len(keys))
	for _, k := range keys {
		d.WriteString(strconv.Quote(k))
		d.WriteByte('=')
		d.WriteString(strconv.Quote(meta[k]))
		d.WriteByte('\n')
	}
	return crc32.Checksum(d.Bytes(), castagnoli)
}

// parseChecksum checks the form of a ChecksumKey value.
func parseChecksum(s string) (uint32, error) {
	hex, ok := strings.CutPrefix(s, checksumPrefix)
	if ok && len(hex) == 8 && strings.ToLower(hex) == hex {
		if v, err := strconv.ParseUint(hex, 16, 32); err == nil {
			return uint32(v), nil
		}
	}
	return 0, formatErr("metadata %q is %q, want %s followed by 8 lowercase hex digits", ChecksumKey, truncate([]byte(s)), checksumPrefix)
}

// verify checks data (a whole file, whose header h describes) against h's
// checksum; a file without one passes.
func verify(h *Header, data []byte) error {
	if h.Checksum == "" {
		return nil
	}
	return checkCRC(h, crc32.Update(headerCRC(h.Entries, h.Metadata), castagnoli, data[h.DataStart:]))
}

// checkCRC compares crc, computed over the file h heads, with h's checksum.
func checkCRC(h *Header, crc uint32) error {
	if got := formatChecksum(crc); got != h.Checksum {
		return fmt.Errorf("%w: the tensor data, tensor entries or metadata changed after the file was written (%s recorded, %s computed); "+
			"use an earlier copy, or if another tool edited it on purpose, remove its %q metadata entry", ErrCorrupt, h.Checksum, got, ChecksumKey)
	}
	return nil
}

// Verify checks that data is a whole, well-formed safetensors file (see
// ParseHeader) and, when it carries a checksum (ChecksumKey), that its
// header and tensor data match it, without decoding the tensors. The error
// wraps ErrFormat for a malformed or truncated file and ErrCorrupt for a
// checksum mismatch. A file without a checksum (PyTorch's, or older
// Tandem's) passes when well formed.
func Verify(data []byte) (*Header, error) {
	h, err := ParseHeader(data, int64(len(data)))
	if err != nil {
		return nil, err
	}
	if err := verify(h, data); err != nil {
		return nil, err
	}
	return h, nil
}
