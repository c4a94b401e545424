//go:build linux

package shm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/tandemml/tandem/comm/transport"
)

// Segment layout. Every field that two ranks touch is a naturally aligned
// 32- or 64-bit word accessed only through sync/atomic; the words one side
// writes often sit on their own cache lines so that producer and consumer do
// not invalidate each other's lines on every step.
//
//	0            header: magic, version, world size, ring capacity, SHA-256 of the token
//	pageSize     one rankBlock per rank: state, pid, heartbeat, abort cause
//	chanBase     one channel per ordered pair of distinct ranks:
//	             chanCtrl bytes of control words, then ringCap bytes of ring
const (
	magic        = 0x7464_6d5f_7368_6d31 // "tdm_shm1"
	pageSize     = 4096
	line         = 128 // two cache lines: adjacent-line prefetch shares pairs
	rankBlock    = 512
	maxCause     = rankBlock - 64
	chanCtrl     = pageSize
	frameHeader  = 64 // a frame's header, and the alignment of every frame
	hdrMagic     = 0
	hdrWorld     = 8
	hdrRingCap   = 16
	hdrTokenHash = 32 // 32 bytes

	// Rank block fields.
	rkState     = 0
	rkPid       = 8
	rkHeartbeat = 16
	rkCauseLen  = 24
	rkCause     = 64

	// Channel control fields, each group on its own lines.
	chHead      = 0        // bytes published by the producer
	chTail      = line     // bytes consumed by the consumer
	chDataSeq   = 2 * line // futex word: bumped on every publish
	chDataWait  = 2*line + 4
	chSpaceSeq  = 3 * line // futex word: bumped on every consume
	chSpaceWait = 3*line + 4
	chBroken    = 4 * line // nonzero: the producer abandoned a message mid-way
)

// Rank states.
const (
	stateAbsent = iota
	stateAttached
	stateClosed
	stateAborted
)

// segment is one rank's mapping of the world's shared file.
type segment struct {
	mem      []byte
	world    int
	ringCap  int
	dev, ino uint64 // the file's identity, for the race detector's anchors
}

func (s *segment) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[off]))
}

func (s *segment) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[off]))
}

func roundUp(x, to int) int { return (x + to - 1) / to * to }

func chanBase(world int) int { return pageSize + roundUp(world*rankBlock, pageSize) }

func segmentSize(world, ringCap int) int {
	return chanBase(world) + world*(world-1)*(chanCtrl+ringCap)
}

func (s *segment) rank(r int) int { return pageSize + r*rankBlock }

// channel returns the offset of the channel that carries src's messages to dst.
func (s *segment) channel(src, dst int) int {
	i := src * (s.world - 1)
	if dst < src {
		i += dst
	} else {
		i += dst - 1
	}
	return chanBase(s.world) + i*(chanCtrl+s.ringCap)
}

// ring returns the data area of the channel at off.
func (s *segment) ring(off int) []byte {
	return s.mem[off+chanCtrl : off+chanCtrl+s.ringCap : off+chanCtrl+s.ringCap]
}

func tokenHash(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// createSegment creates and maps a new segment file in dir, readable and
// writable by this user only, and initialises its header.
func createSegment(dir string, world, ringCap int, token string) (*segment, string, error) {
	var rnd [16]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, "", fmt.Errorf("shm: connect: drawing a segment name: %w", err)
	}
	path := dir + "/" + segmentPrefix + hex.EncodeToString(rnd[:])
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("shm: connect: creating the shared segment: %w; check that %s exists and is writable (a tmpfs such as /dev/shm)", err, dir)
	}
	defer f.Close()
	size := segmentSize(world, ringCap)
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, "", fmt.Errorf("shm: connect: sizing the shared segment to %d bytes: %w", size, err)
	}
	// Reserve the pages now: a tmpfs that runs out of room under a sparse
	// file kills the process that touches the missing page with SIGBUS,
	// where this fails with ENOSPC and a message.
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil && err != syscall.EOPNOTSUPP {
		os.Remove(path)
		return nil, "", fmt.Errorf("shm: connect: reserving %d bytes for the shared segment in %s: %w; give it more room (docker run --shm-size, a larger tmpfs), shrink the rings (WithRingBytes) or use the tcp backend (TANDEM_BACKEND=tcp)",
			size, dir, err)
	}
	s, err := mapSegment(f, size)
	if err != nil {
		os.Remove(path)
		return nil, "", err
	}
	s.world, s.ringCap = world, ringCap
	h := tokenHash(token)
	copy(s.mem[hdrTokenHash:], h[:])
	s.u64(hdrWorld).Store(uint64(world))
	s.u64(hdrRingCap).Store(uint64(ringCap))
	s.u64(hdrMagic).Store(magic) // last: a rank that sees it sees the rest
	return s, path, nil
}

// openSegment maps the segment file at path that rank 0 created and checks
// that it belongs to this world and this token.
func openSegment(path string, world int, token string) (*segment, error) {
	if !strings.HasPrefix(filepath.Base(path), segmentPrefix) {
		return nil, fmt.Errorf("shm: connect: the store names %q as the shared segment, which is not a Tandem segment's name: %w", path, transport.ErrMismatch)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: connect: opening the shared segment %s: %w; the shm backend needs every rank on the same host as rank 0 (use tcp across hosts)", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: connect: %w", err)
	}
	if fi.Size() < int64(pageSize) {
		return nil, fmt.Errorf("shm: connect: the shared segment %s holds %d bytes, too few for a header: %w", path, fi.Size(), transport.ErrMismatch)
	}
	s, err := mapSegment(f, int(fi.Size()))
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*segment, error) {
		syscall.Munmap(s.mem)
		return nil, err
	}
	if s.u64(hdrMagic).Load() != magic {
		return fail(fmt.Errorf("shm: connect: %s is not a Tandem shared segment: %w", path, transport.ErrMismatch))
	}
	h := tokenHash(token)
	if string(s.mem[hdrTokenHash:hdrTokenHash+32]) != string(h[:]) {
		return fail(fmt.Errorf("shm: connect: the shared segment was created for another token: %w", transport.ErrUnauthorized))
	}
	if w := int(s.u64(hdrWorld).Load()); w != world {
		return fail(fmt.Errorf("shm: connect: the shared segment is for a world of %d ranks, this rank was told %d: %w", w, world, transport.ErrMismatch))
	}
	s.world, s.ringCap = world, int(s.u64(hdrRingCap).Load())
	if segmentSize(world, s.ringCap) != len(s.mem) {
		return fail(fmt.Errorf("shm: connect: the shared segment's size %d does not match its header: %w", len(s.mem), transport.ErrMismatch))
	}
	return s, nil
}

func mapSegment(f *os.File, size int) (*segment, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: connect: mapping %d bytes of shared memory: %w", size, err)
	}
	s := &segment{mem: mem}
	if fi, err := f.Stat(); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			s.dev, s.ino = uint64(st.Dev), st.Ino
		}
	}
	return s, nil
}

func (s *segment) unmap() error { return syscall.Munmap(s.mem) }
