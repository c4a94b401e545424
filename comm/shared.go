package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/transport"
)

// Shared tensors.
//
// A SharedTensor is a tensor whose memory lies in a shared-memory segment
// that every member of its group maps: one region a rank, the tensor of
// rank r in region r. An all-reduce of a shared tensor (on the group that
// made it) runs in place, straight out of the members' regions: each rank
// reduces its share of the elements from every region into its own and,
// after a barrier, copies the other shares from their owners' regions. No
// byte goes through a transport's buffers, so each rank moves about 2.75
// times the tensor's bytes (four ranks) instead of about 6.75 in the ring.
// DDP keeps its gradient buckets in shared tensors (ddp.SharedBuckets, on
// by default), so that gradients are computed where the peers read them.

// sharedAlign is the size of a rank's region, rounded up to it (pages).
const sharedAlign = 4096

// SharedTensor is a tensor in memory that every member of a group maps
// (see NewSharedTensor). Its methods are safe for concurrent use.
type SharedTensor struct {
	pg  *ProcessGroup
	seg *sharedSeg
	t   *tensor.Dense
}

// sharedSeg is one mapped segment: n regions of stride bytes, this rank's
// tensor (bytes long) at the start of region rank.
type sharedSeg struct {
	name          string // the segment's file name, the same on every rank
	mem           []byte
	stride, bytes int
	rank          int
	closeOnce     sync.Once
	closeErr      error
}

func (s *sharedSeg) region(r int) []byte { return s.mem[r*s.stride : r*s.stride+s.bytes] }

// NewSharedTensor makes a tensor of dtype dt and shape whose memory every
// member of the group maps, zeroed. It is a collective: every member calls
// it, in the same order as its other collectives, with the same dtype and
// shape. It needs a transport whose ranks all run on this host (the shm
// backend, or in-process ranks); elsewhere it fails with an error wrapping
// errors.ErrUnsupported, and callers use an ordinary tensor instead. When
// the memory cannot be had (a /dev/shm without room for every member's
// region) it fails on every member with an error wrapping
// ErrSharedUnavailable, which callers can treat the same way.
//
// All-reduces of the tensor (or of a contiguous part of it at the same
// place on every rank) on this group run in place through the shared
// memory (see AllReduce). Close gives the memory back.
func (pg *ProcessGroup) NewSharedTensor(ctx context.Context, dt tensor.Dtype, shape ...int) (*SharedTensor, error) {
	desc := fmt.Sprintf("new_shared_tensor(%v,%v)", dt, shape)
	cdt := dtypeOf(dt)
	n := 1
	var invalid error
	for _, d := range shape {
		if d < 0 {
			invalid = errorf(ErrInvalidArgument, "new_shared_tensor: shape %v has a negative dimension", shape)
		}
		n *= d
	}
	switch {
	case invalid != nil:
	case cdt == dtInvalid || cdt.isHalf():
		invalid = errorf(ErrInvalidArgument, "new_shared_tensor: dtype %v; shared tensors hold float32, float64, int8, uint8, int32 or int64", dt)
	case n == 0:
		invalid = errorf(ErrInvalidArgument, "new_shared_tensor: shape %v has no elements", shape)
	}
	if oh, ok := pg.world.t.(transport.OneHost); invalid == nil && (!ok || !oh.OneHost()) {
		return nil, fmt.Errorf("comm: new_shared_tensor on group %q: its transport (%T) does not run every rank on one host; use an ordinary tensor: %w", pg.name, pg.world.t, errors.ErrUnsupported)
	}
	bytes := n * cdt.size()
	var seg *sharedSeg
	var unavailable error // agreed by every member: the collective itself succeeds
	err := pg.start(ctx, collective{name: "new_shared_tensor", desc: desc, invalid: invalid,
		run: func(ctx context.Context, c *opCtx) error {
			var err error
			seg, err = mapShared(ctx, c, bytes, stepSharedName, "new_shared_tensor")
			if errors.Is(err, ErrSharedUnavailable) {
				unavailable = err
				return nil
			}
			return err
		}}).Wait(ctx)
	if err != nil {
		if seg != nil {
			unmapShared(seg.mem) // mapped on every member, yet this one's collective failed
		}
		return nil, err
	}
	if unavailable != nil {
		return nil, fmt.Errorf("comm: new_shared_tensor on group %q: %w", pg.name, unavailable)
	}
	mine := seg.region(seg.rank)
	backing := reflect.SliceAt(dt.Type, unsafe.Pointer(&mine[0]), n).Interface()
	st := &SharedTensor{pg: pg, seg: seg, t: tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing))}
	pg.sharedMu.Lock()
	pg.shared = append(pg.shared, seg)
	pg.sharedMu.Unlock()
	return st, nil
}

// Tensor returns this rank's tensor, whose memory is shared.
func (s *SharedTensor) Tensor() *tensor.Dense { return s.t }

// Close stops sharing the memory. The tensor keeps its values and its
// address (the peers' regions are dropped and its own becomes private
// memory of this process), so gradients or views still referring to it stay
// valid; its all-reduces run through the transport again. The private copy
// is this process's until it exits. Close does not involve the peers, and
// closing twice returns the first result.
func (s *SharedTensor) Close() error {
	s.pg.sharedMu.Lock()
	for i, g := range s.pg.shared {
		if g == s.seg {
			s.pg.shared = append(s.pg.shared[:i], s.pg.shared[i+1:]...)
			break
		}
	}
	s.pg.sharedMu.Unlock()
	s.seg.closeOnce.Do(func() { s.seg.closeErr = detachShared(s.seg) })
	return s.seg.closeErr
}

// sharedOf returns the shared segment whose region of this rank holds all
// of b, and b's offset in it, or nil.
func (pg *ProcessGroup) sharedOf(b []byte) (*sharedSeg, int) {
	if len(b) == 0 {
		return nil, 0
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	pg.sharedMu.Lock()
	defer pg.sharedMu.Unlock()
	for _, s := range pg.shared {
		r := s.region(s.rank)
		lo := uintptr(unsafe.Pointer(&r[0]))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(r)) {
			return s, int(p - lo)
		}
	}
	return nil, 0
}

// Steps of NewSharedTensor and sharedAllReduce: mapShared's three steps
// start at stepSharedName.
const (
	stepSharedName    = 1
	stepSharedBarrier = 16 // and up, 16 a barrier
)

// sharedMsg is the size of mapShared's messages: a status byte (0 for
// success), a length and a text (the segment's name, or what failed).
const sharedMsg = 512

func encodeShared(ok bool, text string) []byte {
	m := make([]byte, sharedMsg)
	if !ok {
		m[0] = 1
	}
	text = text[:min(len(text), sharedMsg-3)]
	binary.LittleEndian.PutUint16(m[1:3], uint16(len(text)))
	copy(m[3:], text)
	return m
}

func decodeShared(m []byte) (bool, string) {
	n := min(int(binary.LittleEndian.Uint16(m[1:3])), sharedMsg-3)
	return m[0] == 0, string(m[3 : 3+n])
}

// The outcome of a mapping that rank 0 sends every member (the first
// byte of its message).
const (
	verdictOK     = 0
	verdictFailed = 1
	verdictRetry  = 2
)

// errMapCutShort marks a mapping that a member's collective ended (a
// mismatch, a deadline, a lost message) before every member had mapped the
// segment: no member keeps it, and the next collective that needs it maps
// it again on every member.
var errMapCutShort = errors.New("the mapping was cut short; the next collective that needs it tries again")

// settleMargin is how long past the collective's deadline a member waits
// for rank 0's verdict, which rank 0 sends by its own deadline.
const settleMargin = 5 * time.Second

// settling is the context a member that holds the segment's name waits
// for the verdict under: ctx's deadline (plus settleMargin) but not its
// cancellation. A mismatch that cancels this member's collective after
// the others have mapped must not leave it alone without the segment
// (the next collective would then wait for a mapping no one else makes).
func settling(ctx context.Context) (context.Context, context.CancelFunc) {
	d := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(d, dl.Add(settleMargin))
	}
	return context.WithCancel(d)
}

// mapShared maps a segment of one region of bytes a member: rank 0 creates
// it and sends its name, the others map it and say whether they could, rank
// 0 removes the name once all have and tells everyone the outcome, so that
// every member succeeds or fails together. A collective cut short while
// rank 0 waits for the members' word ends the mapping on every member with
// errMapCutShort, and one cut short on a member that has the name still
// learns the outcome, so that all keep the segment or none does. Its
// messages use steps step, step+1 and step+2; what names the purpose in
// errors.
func mapShared(ctx context.Context, c *opCtx, bytes int, step uint16, what string) (*sharedSeg, error) {
	n, r := c.size(), c.rank()
	stepName, stepAck, stepVerdict := step, step+1, step+2
	stride := (bytes + sharedAlign - 1) / sharedAlign * sharedAlign
	size := n * stride
	dir := c.pg.opts.sharedDir
	if r == 0 {
		name, mem, err := createShared(dir, size)
		if err != nil {
			msg := encodeShared(false, err.Error())
			for p := 1; p < n; p++ {
				c.send(ctx, p, stepName, msg)
			}
			return nil, fmt.Errorf("comm: %s: %w: %w", what, ErrSharedUnavailable, err)
		}
		msg := encodeShared(true, name)
		// failed: members that could not map it; lost: messages that did
		// not go or come (the collective cut short, a peer gone).
		var failed, lost []string
		for p := 1; p < n; p++ {
			if err := c.send(ctx, p, stepName, msg); err != nil {
				lost = append(lost, err.Error())
			}
		}
		ack := make([]byte, sharedMsg)
		for p := 1; p < n && len(lost) == 0; p++ {
			if err := c.recv(ctx, p, stepAck, ack); err != nil {
				lost = append(lost, err.Error())
				continue
			}
			if ok, text := decodeShared(ack); !ok {
				failed = append(failed, fmt.Sprintf("rank %d: %s", p, text))
			}
		}
		removeShared(dir, name)
		verdict := verdictOK
		switch {
		case len(lost) > 0:
			verdict, failed = verdictRetry, lost
		case len(failed) > 0:
			verdict = verdictFailed
		}
		vmsg := encodeShared(true, fmt.Sprint(failed))
		vmsg[0] = byte(verdict)
		sctx, cancel := settling(ctx)
		defer cancel()
		for p := 1; p < n; p++ {
			if err := c.send(sctx, p, stepVerdict, vmsg); err != nil && verdict == verdictOK {
				// A member that hears nothing fails its wait: let none
				// keep the segment.
				verdict, failed = verdictRetry, append(failed, err.Error())
			}
		}
		switch verdict {
		case verdictRetry:
			unmapShared(mem)
			return nil, fmt.Errorf("comm: %s: %w: %v", what, errMapCutShort, failed)
		case verdictFailed:
			unmapShared(mem)
			return nil, fmt.Errorf("comm: %s: members could not map the segment: %v: %w", what, failed, ErrSharedUnavailable)
		}
		return &sharedSeg{name: name, mem: mem, stride: stride, bytes: bytes, rank: r}, nil
	}
	msg := make([]byte, sharedMsg)
	if err := c.recv(ctx, 0, stepName, msg); err != nil {
		return nil, fmt.Errorf("comm: %s: %w: %w", what, errMapCutShort, err)
	}
	ok, name := decodeShared(msg)
	if !ok {
		return nil, fmt.Errorf("comm: %s: rank 0 could not make the segment: %s: %w", what, name, ErrSharedUnavailable)
	}
	mem, err := openShared(dir, name, size)
	ack := encodeShared(err == nil, "")
	if err != nil {
		ack = encodeShared(false, err.Error())
	}
	c.send(ctx, 0, stepAck, ack) // unsent, rank 0 misses it and says so
	sctx, cancel := settling(ctx)
	defer cancel()
	e := c.recv(sctx, 0, stepVerdict, msg)
	switch {
	case e != nil:
		err = fmt.Errorf("%w: %w", errMapCutShort, e)
	case msg[0] == verdictOK && err == nil:
	case msg[0] == verdictRetry:
		_, text := decodeShared(msg)
		err = fmt.Errorf("%w: %s", errMapCutShort, text)
	case err != nil:
		err = fmt.Errorf("%w: %w", ErrSharedUnavailable, err)
	default:
		_, text := decodeShared(msg)
		err = fmt.Errorf("members could not map the segment: %s: %w", text, ErrSharedUnavailable)
	}
	if err != nil {
		if mem != nil {
			unmapShared(mem)
		}
		return nil, fmt.Errorf("comm: %s: %w", what, err)
	}
	return &sharedSeg{name: name, mem: mem, stride: stride, bytes: bytes, rank: r}, nil
}

// sharedBarrier returns once every member has reached barrier number k of
// this collective (a dissemination barrier: ceil(log2 n) rounds of one-byte
// messages), which also orders every member's writes to the shared memory
// before it before every member's reads after it.
func sharedBarrier(ctx context.Context, c *opCtx, k int) error {
	n, r := c.size(), c.rank()
	one, got := []byte{1}, []byte{0}
	for round, d := 0, 1; d < n; round, d = round+1, d*2 {
		step := uint16(stepSharedBarrier + 16*k + round)
		if err := c.send(ctx, (r+d)%n, step, one); err != nil {
			return err
		}
		if err := c.recv(ctx, (r-d+n)%n, step, got); err != nil {
			return err
		}
	}
	return nil
}

// sharedBlock is the part of a shared all-reduce that goes through its
// two phases at a time: the shares of one block, reduced by their owners,
// are copied by the other members while the owners reduce the next block
// (a pipeline of one barrier a block). On the two-core development machine
// (2026-11-25, tandem bench allreduce -shared, 10 iterations, two runs)
// 64 MiB took 61-63 ms with four ranks and 14-20 with two in blocks of 16
// MiB, 68-74 and 14-15 in one block, 64 and 19 in blocks of 1 MiB: each
// barrier of four ranks on two cores costs context switches.
const sharedBlock = 16 << 20

// sharedAllReduce all-reduces b, which lies at off in this rank's region
// of seg, the same place in every member's, block by block: each rank
// reduces its share of a block's elements (splitEven) from every region
// into its own and, once every member has reduced its share of that block
// (a barrier), copies every other share from its owner's region while
// reducing its share of the next block. Each share is computed once, so
// every member ends with the same bits.
func sharedAllReduce(ctx context.Context, c *opCtx, seg *sharedSeg, off int, b []byte, dt dtype, k ReduceKind, finalize func([]byte)) error {
	n, r, es := c.size(), c.rank(), dt.size()
	block := max(sharedBlock, len(b)/1024) / es * es // at most 1024 blocks
	type share struct {
		p  []byte // in b
		at int    // its offset in the regions
	}
	var blocks [][]share
	for lo := 0; lo < len(b); lo += block {
		blk := b[lo:min(lo+block, len(b))]
		shares := make([]share, n)
		pos := off + lo
		for i, p := range splitEven(blk, es, n) {
			shares[i] = share{p, pos}
			pos += len(p)
		}
		blocks = append(blocks, shares)
	}
	reduce := func(shares []share) {
		mine := shares[r]
		if len(mine.p) == 0 {
			return
		}
		for j := 0; j < n; j++ {
			if j != r {
				reduceInto(mine.p, seg.region(j)[mine.at:mine.at+len(mine.p)], dt, k)
			}
		}
		if finalize != nil {
			finalize(mine.p)
		}
	}
	gather := func(shares []share) {
		for j, s := range shares {
			if j != r {
				copy(s.p, seg.region(j)[s.at:s.at+len(s.p)])
			}
		}
	}
	if err := sharedBarrier(ctx, c, 0); err != nil {
		return err
	}
	reduce(blocks[0])
	for i := 1; i <= len(blocks); i++ {
		if err := sharedBarrier(ctx, c, i); err != nil {
			return err
		}
		if i < len(blocks) {
			reduce(blocks[i])
		}
		gather(blocks[i-1])
	}
	// No member may write its region again (its next gradients, the next
	// all-reduce) while another still copies from it.
	return sharedBarrier(ctx, c, len(blocks)+1)
}
