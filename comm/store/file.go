package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The file of a file store is a header followed by an append-only log of
// records, each framed so that a write cut short by a crash is recognised
// and discarded:
//
//	file   = "tandem-store-v1\n" record*
//	record = length:uint32 crc32:uint32 body      (big-endian; crc32 IEEE of body)
//	body   = kind:u8 keylen:uvarint key vallen:uvarint value
//
// A process replays the records it has not seen yet before every operation,
// holding flock(2): shared to read, exclusive to append. Add, CompareSet and
// the like are decided under the exclusive lock and logged as plain sets.
const fileMagic = "tandem-store-v1\n"

const (
	recSet    byte = 1
	recDelete byte = 2
	recAppend byte = 3
)

// maxRecord bounds one record, to refuse a corrupt length before allocating.
const maxRecord = 1 << 31

// File is a store kept in a file that several processes on one machine (or
// on a file system with working flock) share, c10d's FileStore. Every
// process opens it with NewFile and the same path; the first creates it.
//
// Writes take an exclusive flock and append to the file; reads take a shared
// one. Get, MultiGet and Wait poll the file, starting after 1 ms and backing
// off to the poll interval (WithPollInterval, default 50 ms), until the keys
// exist or the context or timeout ends. The file only grows (deleted keys
// stay in the log); remove it when the job is over. Handles in one process
// each open the file on their own and are as independent as processes.
type File struct {
	path string
	cfg  config

	mu     sync.Mutex // serialises this handle's use of f and its state
	f      *os.File
	data   map[string][]byte
	off    int64 // end of the last record applied; 0 before the header is read
	closed bool
	done   chan struct{}
}

var _ Store = (*File)(nil)

// NewFile opens (creating if needed) the file store at path. Options:
// WithTimeout (default bound of blocking calls, and of waiting for the file
// lock), WithPollInterval.
func NewFile(path string, opts ...Option) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: open file store: %w", err)
	}
	s := &File{path: path, cfg: newConfig(opts), f: f, data: map[string][]byte{}, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	defer cancel()
	// Write the header now if the file is new, and check it if not.
	if err := s.locked(ctx, "open", true, func() error { return nil }); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// Path returns the file's path.
func (s *File) Path() string { return s.path }

// locked runs fn with the file locked (exclusively if excl) and the state
// brought up to date with the file.
func (s *File) locked(ctx context.Context, op string, excl bool, fn func() error) error {
	if err := enter(ctx, op); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return closedError(op)
	}
	how := syscall.LOCK_SH
	if excl {
		how = syscall.LOCK_EX
	}
	if err := s.flock(ctx, op, how); err != nil {
		return err
	}
	defer syscall.Flock(int(s.f.Fd()), syscall.LOCK_UN)
	if err := s.catchUp(excl); err != nil {
		return err
	}
	return fn()
}

// flock takes the file lock, polling so that a context or timeout bounds
// the wait even if another process holds the lock for long.
func (s *File) flock(ctx context.Context, op string, how int) error {
	pause := 50 * time.Microsecond
	var timer *time.Timer
	for {
		err := syscall.Flock(int(s.f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("store %s: lock %s: %w", op, s.path, err)
		}
		if timer == nil {
			dl, _ := deadline(ctx, 0, s.cfg.timeout)
			timer = time.NewTimer(time.Until(dl))
			defer timer.Stop()
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return ctxError(ctx, op)
		case <-timer.C:
			return fmt.Errorf("store: %s: file %s stayed locked by another process for %v: %w", op, s.path, s.cfg.timeout, ErrTimeout)
		}
		pause = min(pause*2, 5*time.Millisecond)
	}
}

// catchUp applies the records other processes appended since the last look.
// With the exclusive lock it also writes the header of a new file and cuts
// off a record left half-written by a writer that died.
func (s *File) catchUp(excl bool) error {
	fi, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("store: stat %s: %w", s.path, err)
	}
	size := fi.Size()
	if size < s.off {
		// The file was truncated or replaced under us: start over.
		s.data, s.off = map[string][]byte{}, 0
	}
	if s.off == 0 {
		if size == 0 {
			if !excl {
				return nil // a new file nobody has written yet: empty
			}
			if _, err := s.f.WriteAt([]byte(fileMagic), 0); err != nil {
				return fmt.Errorf("store: initialise %s: %w", s.path, err)
			}
			s.off = int64(len(fileMagic))
			return nil
		}
		hdr := make([]byte, len(fileMagic))
		if _, err := s.f.ReadAt(hdr, 0); err != nil || string(hdr) != fileMagic {
			return fmt.Errorf("%s is not a tandem file store (bad header); pick another path: %w", s.path, ErrInvalidArgument)
		}
		s.off = int64(len(fileMagic))
	}
	if size == s.off {
		return nil
	}
	buf := make([]byte, size-s.off)
	if _, err := s.f.ReadAt(buf, s.off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("store: read %s: %w", s.path, err)
	}
	n := s.replay(buf)
	s.off += int64(n)
	if n < len(buf) && excl {
		if err := s.f.Truncate(s.off); err != nil {
			return fmt.Errorf("store: cut a torn record off %s: %w", s.path, err)
		}
	}
	return nil
}

// replay applies every whole, intact record at the start of buf and returns
// how many bytes they take.
func (s *File) replay(buf []byte) int {
	done := 0
	for {
		rest := buf[done:]
		if len(rest) < 8 {
			return done
		}
		n := binary.BigEndian.Uint32(rest)
		if uint64(n) > uint64(len(rest)-8) || n > maxRecord {
			return done
		}
		body := rest[8 : 8+n]
		if crc32.ChecksumIEEE(body) != binary.BigEndian.Uint32(rest[4:]) {
			return done
		}
		d := decoder{p: body[1:]}
		key := string(d.bytes())
		val := d.bytes()
		if d.err != nil || len(d.p) != 0 {
			return done
		}
		switch body[0] {
		case recSet:
			s.data[key] = bytes.Clone(val)
			if s.data[key] == nil {
				s.data[key] = []byte{}
			}
		case recAppend:
			s.data[key] = append(s.data[key], val...)
			if s.data[key] == nil {
				s.data[key] = []byte{}
			}
		case recDelete:
			delete(s.data, key)
		default:
			return done
		}
		done += 8 + int(n)
	}
}

func appendRecord(dst []byte, kind byte, key string, val []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, kind)
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = binary.AppendUvarint(dst, uint64(len(val)))
	dst = append(dst, val...)
	body := dst[start+8:]
	binary.BigEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(dst[start+4:], crc32.ChecksumIEEE(body))
	return dst
}

// write appends records (under the exclusive lock) and applies them.
func (s *File) write(recs []byte) error {
	if len(recs) == 0 {
		return nil
	}
	if _, err := s.f.WriteAt(recs, s.off); err != nil {
		return fmt.Errorf("store: write %s: %w", s.path, err)
	}
	n := s.replay(recs)
	s.off += int64(n)
	return nil
}

// Set implements Store.
func (s *File) Set(ctx context.Context, key string, value []byte) error {
	return s.locked(ctx, "set", true, func() error {
		return s.write(appendRecord(nil, recSet, key, value))
	})
}

// Get implements Store.
func (s *File) Get(ctx context.Context, key string) ([]byte, error) {
	vals, err := s.poll(ctx, "get", []string{key}, 0)
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}

// Add implements Store.
func (s *File) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var out int64
	err := s.locked(ctx, "add", true, func() error {
		var cur int64
		if v, ok := s.data[key]; ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return fmt.Errorf("store add: key %q holds %q, not a decimal integer counter: %w",
					key, truncate(v), ErrInvalidArgument)
			}
			cur = n
		}
		if (delta > 0 && cur > math.MaxInt64-delta) || (delta < 0 && cur < math.MinInt64-delta) {
			return fmt.Errorf("store add: counter %q = %d plus %d overflows int64: %w", key, cur, delta, ErrInvalidArgument)
		}
		out = cur + delta
		return s.write(appendRecord(nil, recSet, key, []byte(strconv.FormatInt(out, 10))))
	})
	return out, err
}

// CompareSet implements Store.
func (s *File) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	var out []byte
	err := s.locked(ctx, "compare-set", true, func() error {
		cur, ok := s.data[key]
		switch {
		case !ok && len(expected) == 0, ok && bytes.Equal(cur, expected):
			out = bytes.Clone(desired)
			return s.write(appendRecord(nil, recSet, key, desired))
		case !ok:
			out = bytes.Clone(expected)
		default:
			out = bytes.Clone(cur)
		}
		return nil
	})
	if out == nil && err == nil {
		out = []byte{}
	}
	return out, err
}

// DeleteKey implements Store.
func (s *File) DeleteKey(ctx context.Context, key string) (bool, error) {
	var existed bool
	err := s.locked(ctx, "delete-key", true, func() error {
		if _, existed = s.data[key]; !existed {
			return nil
		}
		return s.write(appendRecord(nil, recDelete, key, nil))
	})
	return existed, err
}

// NumKeys implements Store.
func (s *File) NumKeys(ctx context.Context) (int64, error) {
	var n int64
	err := s.locked(ctx, "num-keys", false, func() error {
		n = int64(len(s.data))
		return nil
	})
	return n, err
}

// Check implements Store.
func (s *File) Check(ctx context.Context, keys []string) (bool, error) {
	ok := true
	err := s.locked(ctx, "check", false, func() error {
		for _, k := range keys {
			if _, found := s.data[k]; !found {
				ok = false
			}
		}
		return nil
	})
	return ok && err == nil, err
}

// Wait implements Store.
func (s *File) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	_, err := s.poll(ctx, "wait", keys, timeout)
	return err
}

// MultiSet implements Store.
func (s *File) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if err := checkMulti("multi-set", keys, values); err != nil {
		return err
	}
	var recs []byte
	for i, k := range keys {
		recs = appendRecord(recs, recSet, k, values[i])
	}
	return s.locked(ctx, "multi-set", true, func() error { return s.write(recs) })
}

// MultiGet implements Store.
func (s *File) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	return s.poll(ctx, "multi-get", keys, 0)
}

// Append implements Store.
func (s *File) Append(ctx context.Context, key string, value []byte) error {
	return s.locked(ctx, "append", true, func() error {
		return s.write(appendRecord(nil, recAppend, key, value))
	})
}

// Close closes the file (it stays on disk); blocked calls return ErrClosed.
func (s *File) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.done)
	s.data = nil
	return s.f.Close()
}

// poll looks for keys until they all exist, backing off between looks.
func (s *File) poll(ctx context.Context, op string, keys []string, timeout time.Duration) ([][]byte, error) {
	if err := enter(ctx, op); err != nil {
		return nil, err
	}
	dl, ctxBound := deadline(ctx, timeout, s.cfg.timeout)
	if timeout <= 0 {
		timeout = s.cfg.timeout
	}
	timer := time.NewTimer(time.Until(dl))
	defer timer.Stop()
	pause := time.Millisecond
	for {
		var vals [][]byte
		err := s.locked(ctx, op, false, func() error {
			out := make([][]byte, len(keys))
			for i, k := range keys {
				v, ok := s.data[k]
				if !ok {
					return nil
				}
				out[i] = bytes.Clone(v)
				if out[i] == nil {
					out[i] = []byte{}
				}
			}
			vals = out
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, waitError(ctx, op, keys, timeout, ctxBound)
			}
			return nil, err
		}
		if vals != nil {
			return vals, nil
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, waitError(ctx, op, keys, timeout, ctxBound)
		case <-timer.C:
			return nil, waitError(ctx, op, keys, timeout, ctxBound)
		case <-s.done:
			return nil, closedError(op)
		}
		pause = min(pause*2, s.cfg.poll)
	}
}
