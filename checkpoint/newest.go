package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
)

// Found is the checkpoint NewestValid chose.
type Found struct {
	Path string
	Data []byte // the file's bytes, as read
	File *File  // Data decoded (and verified against its checksum)
}

// Skipped is a file NewestValid passed over, and why: its error wraps
// ErrFormat (truncated, bad header), ErrCorrupt (checksum mismatch) or the
// read error.
type Skipped struct {
	Path string
	Err  error
}

// NewestValid tries the files in paths, which the caller orders newest
// first, and returns the first that reads and decodes in full (a
// checksummed file also matching its checksum), with those it passed over
// before it and why. A run that resumes from it thereby survives a newest
// checkpoint that was truncated or damaged, instead of failing on it at
// every restart. When no file qualifies, the error wraps fs.ErrNotExist and
// the skipped files are still returned (all of paths).
//
// Only damage makes a file skipped: whether the checkpoint fits the model
// is for the caller to check (CopyInto), and a misfit there is not a reason
// to fall back to an older file.
func NewestValid(paths []string) (*Found, []Skipped, error) {
	var skipped []Skipped
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			skipped = append(skipped, Skipped{p, fmt.Errorf("checkpoint: %w", err)})
			continue
		}
		f, err := Decode(data)
		if err != nil {
			skipped = append(skipped, Skipped{p, err})
			continue
		}
		return &Found{Path: p, Data: data, File: f}, skipped, nil
	}
	if len(paths) == 0 {
		return nil, nil, fmt.Errorf("checkpoint: no checkpoint files: %w", fs.ErrNotExist)
	}
	return nil, skipped, fmt.Errorf("checkpoint: none of the %d checkpoint file(s) is intact: %w", len(paths), fs.ErrNotExist)
}
