package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/futex"
)

// Staged all-reduce and reduce.
//
// On a group whose ranks all run on this host (the shm backend, in-process
// ranks), an all-reduce of an ordinary tensor goes through a staging
// segment instead of the transport (and so do reduces, below, and
// broadcasts, gathers, all-gathers and reduce-scatters: stagecopy.go). The group maps it on its first staged
// collective (mapShared): a region a rank, each a header and three buffers
// of stageBlock bytes (stageblock.go). A rank copies its tensor into its own region, and
// the ranks then read each other's regions directly:
//
//   - below the ring threshold, every rank reduces the whole tensor out of
//     every region, in rank order (so every rank computes the same bits),
//     after one barrier;
//   - from the threshold up, the tensor goes through in blocks of
//     stageBlock bytes: each rank reduces its share of a block (splitEven)
//     from every region into its own tensor and publishes the result in its
//     region; after the next barrier the others copy it. Block j+1 is
//     staged while block j's shares are reduced, and with three buffers a
//     rank may write block j+3's buffer once everyone passed the barrier
//     after block j+1 was staged, by which time every read of block j is
//     done: one barrier a block.
//
// Four ranks thus move about 4.5 times the tensor's bytes each (copy in,
// reduce, publish, copy out), against about 6.75 through a ring of the
// transport's buffers, and synchronise once a block instead of at every
// ring step.
//
// Synchronisation is through words in the headers: each rank's arrival
// word holds the last barrier it reached, and its busy word the collective
// it is reading peers' regions for. Barriers are counted per collective
// (the collective's sequence number, extended to 64 bits, and the barrier's
// index), so a collective that goes wrong (a mismatch, which every rank
// reports) leaves nothing out of step for the next. Before its first write
// a rank waits for every peer to have finished reading for earlier
// collectives (their busy words), so no barrier is needed at the end.
// Waiters sleep on a futex word in rank 0's header (polling first when the
// ranks have a CPU each), which arrivals ring; a sleeper looks at its
// context and at the peers' liveness every stageTick.

// stageBlock, the size of one of a rank's three staging buffers, is rank
// 0's stageBlockSize (stageblock.go: a core's level-2 cache), which every
// member takes from it when the segment is mapped.

// Layout of a rank's region: the header, then three buffers.
const (
	stageHeader   = 4096
	stageBuffers  = 3
	stageArrive   = 0   // uint64: the last barrier reached (stageMark)
	stageBusy     = 64  // uint64: 1 + the extended sequence number of the collective reading peers' regions, shifted left by stageBuffers, or'd with a bit a buffer it reads; or 0
	stageBell     = 128 // uint32, rank 0's: bumped by every arrival that may end a wait
	stageSleepers = 192 // uint32, rank 0's: ranks asleep on the bell
	// stageFinger is where a rank's fingerprint frames start: one a
	// buffer, written by a collective whose check runs in the segment
	// (stagecheck.go).
	stageFinger = 1024
)

// stageTick is how long a sleeper sleeps before it looks at its context and
// at its peers' liveness.
const stageTick = 10 * time.Millisecond

// stageSpin is how long a wait polls before it sleeps (every wait when each
// rank has a CPU of its own; a one-buffer collective's where the ranks
// outnumber the CPUs). With 50 µs, two ranks on two cores took 10 µs for some
// all-reduces of 4 KiB and 122 µs for others (tandem bench allreduce,
// 200 iterations): a peer that the scheduler holds back a little longer
// costs a futex sleep and wake-up; with 200 µs, 10 µs in every run.
const stageSpin = 200 * time.Microsecond

// maxStageRounds bounds the blocks of one all-reduce (the barrier index
// takes the low 24 bits of the arrival word).
const maxStageRounds = 1<<24 - 2

// stepStage numbers mapShared's messages when it maps a group's staging
// segment: steps no algorithm of the collective uses, since the mapping
// runs inside the group's first staged collective.
const stepStage = 0xFF00

// stage is a group's staging segment.
type stage struct {
	seg *sharedSeg
	// block is the size a large tensor goes through in (the level-2
	// cache's); room, each staging buffer's size, at least stageRoom: a
	// reduction of up to room bytes goes through in one round.
	block, room int
	// spin is how long a wait of a collective in rounds polls before it
	// sleeps; spinOne, one of a collective in one buffer (reduceTo's
	// small path), whose waits are short.
	spin, spinOne time.Duration
	last          uint64   // the extended sequence number of this rank's last staged collective
	partsBuf      [][]byte // see parts
}

// stageFor returns the group's staging segment, mapping it on first use
// (a collective step of c), or nil when the group does not stage: it is
// turned off (WithStaging), its ranks are not all on this host, or the
// segment is unavailable (then it never tries again and says so in the
// log). Every member gets the same answer: the mapping succeeds or fails
// on all (mapShared). A mapping cut short on any member (a deadline, a
// mismatch that stopped its collective, a lost message) is not a failure
// to map: it returns the error and the next staged collective tries again,
// as every member does.
func (pg *ProcessGroup) stageFor(ctx context.Context, c *opCtx) (*stage, error) {
	if !pg.opts.staging {
		return nil, nil
	}
	if oh, ok := pg.world.t.(transport.OneHost); !ok || !oh.OneHost() {
		return nil, nil
	}
	pg.stageMu.Lock()
	st, off := pg.stage, pg.stageOff
	pg.stageMu.Unlock()
	if st != nil || off {
		return st, nil
	}
	block, err := agreeStageBlock(ctx, c)
	if err != nil {
		return nil, err
	}
	room := max(block, stageRoom)
	seg, err := mapShared(ctx, c, stageHeader+stageBuffers*room, stepStage, "staging collectives")
	if err != nil && !errors.Is(err, ErrSharedUnavailable) {
		// Cut short (a mismatch, a deadline, a lost peer): every member
		// tries again with its next staged collective.
		return nil, err
	}
	pg.stageMu.Lock()
	defer pg.stageMu.Unlock()
	if err != nil {
		pg.stageOff = true
		pg.opts.logger.Warn("comm: this group's collectives go through the transport: no staging segment", "group", pg.name, "rank", pg.rank, "err", err)
		return nil, nil
	}
	spin, spinOne := stageSpin, stageSpin
	if c.size() > runtime.NumCPU() {
		// Ranks that outnumber the CPUs take turns on them. A poll gives
		// its CPU away at every look (futex.Yield), which for a small
		// collective's short waits is quicker than a sleep and a wake-up
		// (four ranks on two cores: all-reduce of 4 KiB in 0.47-0.50 ms
		// polling against 0.91-1.14 sleeping); in a large one it has the
		// ranks trade the CPU at every block and evict each other's
		// data (16 MiB in 17-21 ms against 14.6-17).
		spin = 0
	}
	if runtime.GOMAXPROCS(0) == 1 {
		// A process of one P that polls, even yielding between looks,
		// keeps its other goroutines (the backward pass that DDP overlaps
		// with its all-reduces) from the processor: DDP's step of two
		// ranks with GOMAXPROCS=1 took 13.9-18.6 ms polling and 6.9
		// sleeping at once (tandem bench ddp, two runs each).
		spin, spinOne = 0, 0
	}
	pg.stage = &stage{seg: seg, block: block, room: room, spin: spin, spinOne: spinOne}
	return pg.stage, nil
}

// agreeStageBlock returns the staging block of rank 0's machine, which
// rank 0 sends every member (step stepStage+3, after mapShared's), so that
// all map and walk the segment alike.
func agreeStageBlock(ctx context.Context, c *opCtx) (int, error) {
	var msg [4]byte
	if c.rank() == 0 {
		block := stageBlockSource(c.size(), c.pg.opts.sharedDir)
		binary.LittleEndian.PutUint32(msg[:], uint32(block))
		for p := 1; p < c.size(); p++ {
			if err := c.send(ctx, p, stepStage+3, msg[:]); err != nil {
				return 0, fmt.Errorf("comm: staging collectives: %w", err)
			}
		}
		return block, nil
	}
	if err := c.recv(ctx, 0, stepStage+3, msg[:]); err != nil {
		return 0, fmt.Errorf("comm: staging collectives: %w", err)
	}
	block := int(binary.LittleEndian.Uint32(msg[:]))
	if block < minStageBlock || block > maxStageBlock || block%4096 != 0 {
		return 0, fmt.Errorf("comm: staging collectives: rank 0 chose buffers of %d bytes, outside [%d, %d] or not whole pages: %w", block, minStageBlock, maxStageBlock, ErrMismatch)
	}
	return block, nil
}

// staging is stageFor for a collective of c: nil for a group of one.
func (c *opCtx) staging(ctx context.Context) (*stage, error) {
	if c.size() == 1 {
		return nil, nil
	}
	return c.pg.stageFor(ctx, c)
}

// releaseStage unmaps the group's staging segment, once no collective can
// be using it.
func (pg *ProcessGroup) releaseStage() {
	pg.stageMu.Lock()
	st := pg.stage
	pg.stage, pg.stageOff = nil, true
	pg.stageMu.Unlock()
	if st != nil {
		unmapShared(st.seg.mem)
	}
}

func (s *stage) word64(r, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.seg.mem[r*s.seg.stride+off]))
}

func (s *stage) word32(r, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.seg.mem[r*s.seg.stride+off]))
}

// finger returns the fingerprint frame of buffer i in rank r's region.
func (s *stage) finger(r, i int) []byte {
	lo := r*s.seg.stride + stageFinger + i*fingerprintSize
	return s.seg.mem[lo : lo+fingerprintSize]
}

// buffer returns buffer i of rank r's region.
func (s *stage) buffer(r, i int) []byte {
	lo := r*s.seg.stride + stageHeader + i*s.room
	return s.seg.mem[lo : lo+s.room]
}

// stageMark is the arrival word of barrier k of the collective whose
// extended sequence number is seq. Barriers count from 1, so that a zeroed
// header has reached none.
func stageMark(seq uint64, k int) uint64 { return seq<<24 | uint64(k) }

// A combiner reduces the ranks' parts of a staged reduction, given in rank
// order.
type combiner interface {
	// whole sets out (none of the parts) to their reduction, in rank
	// order, so that every rank computes the same bits.
	whole(out []byte, parts [][]byte)
	// share reduces the parts into mine, which is parts[r] itself.
	share(mine []byte, parts [][]byte, r int)
}

// numbers combines the six plain dtypes with a reduce kind (a
// premultiplied sum's inputs are scaled beforehand); finalize, when not
// nil, runs on every result (an average's division).
type numbers struct {
	dt       dtype
	k        ReduceKind
	finalize func([]byte)
	others   [][]byte
}

func (m *numbers) whole(out []byte, parts [][]byte) {
	copy(out, parts[0])
	reduceFrom(out, parts[1:], m.dt, m.k)
	if m.finalize != nil {
		m.finalize(out)
	}
}

// share adds the others' parts to mine in rank order.
func (m *numbers) share(mine []byte, parts [][]byte, r int) {
	m.others = append(append(m.others[:0], parts[:r]...), parts[r+1:]...)
	reduceFrom(mine, m.others, m.dt, m.k)
	if m.finalize != nil {
		m.finalize(mine)
	}
}

// halves combines 16-bit floats in float32, rounding once (halfreduce.go).
type halves struct{ f *halfFold }

func (h halves) whole(out []byte, parts [][]byte)         { h.f.fold(out, parts) }
func (h halves) share(mine []byte, parts [][]byte, _ int) { h.f.fold(mine, parts) }

// ring tells sleepers that a word they may wait on changed. The
// sequentially consistent atomics order it against await: either a
// sleeper's count is seen here and it is woken, or its re-check of its
// condition, after it counted itself, sees the change.
func (s *stage) ring() {
	bell := s.word32(0, stageBell)
	bell.Add(1)
	if s.word32(0, stageSleepers).Load() != 0 {
		futex.Wake(bell)
	}
}

// await returns once cond holds. It polls for spin, then sleeps on the
// bell; between sleeps it gives up when ctx ends or a peer is lost, with
// what (a description of the wait) in the error.
func (s *stage) await(ctx context.Context, c *opCtx, spin time.Duration, cond func() bool, what func() string) error {
	return s.awaitWatched(ctx, c, spin, cond, what, nil)
}

// awaitWatched is await that also gives up when watch, called before every
// sleep, returns an error (which it returns as it is).
func (s *stage) awaitWatched(ctx context.Context, c *opCtx, spin time.Duration, cond func() bool, what func() string, watch func() error) error {
	if cond() {
		return nil
	}
	if futex.Poll(spin, cond) {
		return nil
	}
	bell, sleepers := s.word32(0, stageBell), s.word32(0, stageSleepers)
	for full := false; ; full = true {
		v := bell.Load()
		sleepers.Add(1)
		if cond() {
			sleepers.Add(^uint32(0))
			return nil
		}
		var err error
		if ctx.Err() != nil {
			err = fmt.Errorf("%s: %w", what(), context.Cause(ctx))
		} else if full {
			if err = c.pg.PeerFailure(); err != nil {
				err = fmt.Errorf("%s: %w", what(), err)
			}
		}
		if err == nil && watch != nil {
			err = watch()
		}
		if err != nil {
			sleepers.Add(^uint32(0))
			if cond() {
				return nil
			}
			return err
		}
		futex.Wait(bell, v, stageTick)
		sleepers.Add(^uint32(0))
	}
}

// barrier returns once every member reached barrier k of collective seq,
// polling for spin before it sleeps. The last to arrive rings the bell;
// every member sees its own arrival before, and the peers' writes to their
// regions before theirs.
func (s *stage) barrier(ctx context.Context, c *opCtx, spin time.Duration, seq uint64, k int) error {
	return s.barrierWatched(ctx, c, spin, seq, k, nil)
}

// barrierWatched is barrier that also gives up when watch, called before
// every sleep, returns an error (see awaitWatched).
func (s *stage) barrierWatched(ctx context.Context, c *opCtx, spin time.Duration, seq uint64, k int, watch func() error) error {
	n, r := c.size(), c.rank()
	mark := stageMark(seq, k)
	s.word64(r, stageArrive).Store(mark)
	all := func() bool {
		for p := range n {
			if p != r && s.word64(p, stageArrive).Load() < mark {
				return false
			}
		}
		return true
	}
	if all() {
		s.ring()
		return nil
	}
	return s.awaitWatched(ctx, c, spin, all, func() string {
		var late []int
		for p := range n {
			if p != r && s.word64(p, stageArrive).Load() < mark {
				late = append(late, p)
			}
		}
		return fmt.Sprintf("waiting at staging barrier %d for ranks %v", k, late)
	}, watch)
}

// begin marks this rank busy with collective seq, reading the buffers in
// mask (bit i for buffer i), and waits until no peer still reads any of
// them for an earlier collective, so that this rank may write them,
// polling for spin before it sleeps.
func (s *stage) begin(ctx context.Context, c *opCtx, spin time.Duration, seq uint64, mask uint64) error {
	n, r := c.size(), c.rank()
	s.word64(r, stageBusy).Store((seq+1)<<stageBuffers | mask)
	free := func() bool {
		for p := range n {
			b := s.word64(p, stageBusy).Load()
			if p != r && b != 0 && b>>stageBuffers-1 < seq && b&mask != 0 {
				return false
			}
		}
		return true
	}
	return s.await(ctx, c, spin, free, func() string { return "waiting for the peers to finish reading the staging buffers" })
}

// end marks this rank done reading the peers' regions.
func (s *stage) end(r int) {
	s.word64(r, stageBusy).Store(0)
	s.ring()
}

// extend returns the 64-bit sequence number of collective seq: the last
// staged collective's plus the 32-bit distance to it.
func (s *stage) extend(seq uint32) uint64 {
	s.last += uint64(seq - uint32(s.last))
	return s.last
}

// allReduce all-reduces b through the staging segment (see above).
func (s *stage) allReduce(ctx context.Context, c *opCtx, b []byte, dt dtype, comb combiner, threshold int) error {
	return s.reduceTo(ctx, c, b, dt, comb, everyRank, nil, threshold)
}

// everyRank is reduceTo's root for an all-reduce.
const everyRank = -1

// reduceTo reduces every rank's b through the staging segment into root's
// b, or into every rank's b when root is everyRank (see above). A rank
// whose b does not take the result leaves it unchanged: it stages all of
// b, applies scale (when not nil) to the staged copy, and reduces its
// share in its own buffer, from which root reads it.
func (s *stage) reduceTo(ctx context.Context, c *opCtx, b []byte, dt dtype, comb combiner, root int, scale func([]byte), threshold int) error {
	n, r := c.size(), c.rank()
	seq := s.extend(c.seq)
	takes := root == everyRank || r == root // b takes the result
	// in copies into the staging buffers (a rank's tensor, and the share
	// of the result it publishes): through the caches, or around them
	// when the blocks the ranks stage in one round cannot stay in them
	// (streamsStaging, set below).
	in := copyCached
	stageCopy := func(dst, src []byte) {
		in(dst, src)
		if !takes && scale != nil {
			scale(dst)
		}
	}
	if len(b) < threshold && len(b) <= s.block {
		// Every rank that takes the result reduces all of it, in rank
		// order, from one buffer: consecutive collectives take turns with
		// the three, so a rank seldom waits for a slow peer to finish
		// reading the last.
		i := int(seq % stageBuffers)
		if err := s.begin(ctx, c, s.spinOne, seq, 1<<i); err != nil {
			return err
		}
		defer s.end(r)
		stageCopy(s.buffer(r, i)[:len(b)], b)
		if err := s.barrier(ctx, c, s.spinOne, seq, 1); err != nil {
			return err
		}
		if takes {
			parts := make([][]byte, n)
			for p := range parts {
				parts[p] = s.buffer(p, i)[:len(b)]
			}
			comb.whole(b, parts)
		}
		return nil
	}
	if err := s.begin(ctx, c, s.spin, seq, 1<<stageBuffers-1); err != nil {
		return err
	}
	defer s.end(r)
	es := dt.size()
	block := s.block / es * es
	if len(b) > 0 && len(b) <= s.room {
		// One round: a barrier fewer for the tensors, DDP's buckets among
		// them, that fit a buffer (make demo's CNN all-reduces one bucket
		// of 841 KiB a step: 2.08 s of communication an epoch in one round,
		// 2.28 in two of 512 KiB).
		block = len(b)
	}
	rounds := (len(b) + block - 1) / block
	if streamsStaging(n, block) {
		in = copyStream
	}
	// Every block but the last is block bytes long, so their shares'
	// bounds (splitEven's) are worked out once, and the last block's once.
	boundsOf := func(length int) []int {
		bs := make([]int, n+1)
		for i, p := range splitEven(b[:length], es, n) {
			bs[i+1] = bs[i] + len(p)
		}
		return bs
	}
	full, last := boundsOf(min(block, len(b))), boundsOf(len(b)-(rounds-1)*block)
	// shares returns block j of b and sets bounds to its shares' bounds.
	var bounds []int
	shares := func(j int) []byte {
		bounds = full
		if j == rounds-1 {
			bounds = last
		}
		return b[j*block : min((j+1)*block, len(b))]
	}
	// A rank that takes the result reduces its share in b, and stages
	// only the others' shares.
	stageIn := func(j int) {
		blk, buf := shares(j), s.buffer(r, j%stageBuffers)
		if !takes {
			stageCopy(buf[:len(blk)], blk)
			return
		}
		stageCopy(buf[:bounds[r]], blk[:bounds[r]])
		stageCopy(buf[bounds[r+1]:len(blk)], blk[bounds[r+1]:])
	}
	parts := make([][]byte, n)
	reduce := func(j int) {
		blk := shares(j)
		lo, hi := bounds[r], bounds[r+1]
		own := s.buffer(r, j%stageBuffers)[lo:hi]
		for p := range n {
			parts[p] = s.buffer(p, j%stageBuffers)[lo:hi]
		}
		if !takes {
			comb.share(own, parts, r)
			return
		}
		mine := blk[lo:hi]
		if root != everyRank {
			parts[r] = mine
			comb.share(mine, parts, r)
			return
		}
		// The share goes in pieces that stay in the level-2 cache
		// between the reduction that writes them to b and the copy that
		// publishes them in the region.
		piece := sharePiece / es * es
		for off := 0; off < len(mine); off += piece {
			end := min(off+piece, len(mine))
			for p := range n {
				parts[p] = s.buffer(p, j%stageBuffers)[lo+off : lo+end]
			}
			parts[r] = mine[off:end]
			comb.share(mine[off:end], parts, r)
			in(own[off:end], mine[off:end])
		}
	}
	// The result goes to b through the caches, or around them for a
	// tensor that cannot stay in them (streamsResult).
	out := copyCached
	if streamsResult(n, len(b)) {
		out = copyStream
	}
	gather := func(j int) {
		if !takes {
			return
		}
		blk := shares(j)
		for p := range n {
			if p != r {
				out(blk[bounds[p]:bounds[p+1]], s.buffer(p, j%stageBuffers)[bounds[p]:bounds[p+1]])
			}
		}
	}
	stageIn(0)
	if err := s.barrier(ctx, c, s.spin, seq, 1); err != nil {
		return err
	}
	for j := range rounds {
		reduce(j)
		if j+1 < rounds {
			stageIn(j + 1)
		}
		if err := s.barrier(ctx, c, s.spin, seq, j+2); err != nil {
			return err
		}
		gather(j)
	}
	return nil
}

// reduce reduces every rank's b into root's b with op (Reduce); the other
// ranks' b are left unchanged. Plain dtypes reduce as all-reduce does (a
// premultiplied sum's inputs scaled first, an average divided last), 16-bit
// floats in float32 in rank order, rounded once (halfFold), as through the
// transport.
func (s *stage) reduce(ctx context.Context, c *opCtx, b []byte, dt dtype, op ReduceOp, root int, threshold int) error {
	n, r := c.size(), c.rank()
	var comb combiner
	var scale func([]byte)
	if dt.isHalf() {
		f := newHalfFold(s.block, dt, op, n)
		defer f.free()
		comb = halves{f}
	} else {
		nums := &numbers{dt: dt, k: op.kind}
		if op.kind == KindAvg {
			nums.finalize = func(p []byte) { divideBuf(p, dt, n) }
		}
		if op.kind == KindPremulSum {
			// Root's b takes the result, so it is scaled in place.
			if r == root {
				scaleBuf(b, dt, op.factor)
			}
			scale = func(p []byte) { scaleBuf(p, dt, op.factor) }
		}
		comb = nums
	}
	return s.reduceTo(ctx, c, b, dt, comb, root, scale, threshold)
}

// stageStream is the size of tensor from which a staged all-reduce writes
// the other ranks' shares of the result into it with non-temporal stores,
// which do not read the destination's lines first. On the two-core
// development machine (2026-11-25, tandem bench allreduce, 15 iterations,
// three runs each) 64 MiB with four ranks took 47-49 ms so against 50-53
// through the caches, and 16 MiB 11.4-11.6 against 11.3-12.9; with two
// ranks 64 MiB took 16.7-18.3 ms against 17.1-17.2, and 16 MiB (the
// ranks' tensors together still within the caches) 2.8-4.1 against 2.5-2.6.
const stageStream = 32 << 20

// stageStreamAll is the ranks' tensors' size together from which a staged
// all-reduce streams the result as well, whatever each tensor's size: the
// result, the staged copies and the other ranks' shares then outgrow the
// last-level cache. On a 2-core AMD Zen 4 machine (32 MiB of level-3
// cache, 2026-12-03, tandem bench allreduce -backend auto -nproc 4 -sizes
// 8M,16M -iters 30, three alternating runs) four ranks' 16 MiB took
// 11.1-11.7 ms streamed against 13.6-14.6 through the caches; two ranks'
// 16 MiB, 32 MiB together, stay cached (2.5-2.6 ms against 2.8-4.1
// streamed, above).
const stageStreamAll = 64 << 20

// streamsResult reports whether a staged all-reduce of n ranks' tensors of
// size bytes writes the result around the caches (stageStream,
// stageStreamAll).
func streamsResult(n, size int) bool {
	return size >= stageStream || n*size >= stageStreamAll
}

// sharePiece is the piece in which a rank that takes an all-reduce's
// result reduces its share and publishes it, so that the copy reads what
// the reduction wrote out of the level-2 cache, not memory. With the
// staged copies streamed as well (streamsStaging), four ranks' 64 MiB on
// the Zen 4 machine below took 33.5-35.4 ms against 43.5-47.2 before
// both (three alternating runs, -iters 20), and 16 MiB 8.2-9.9 against
// 9.9-11.3.
const sharePiece = 256 << 10

// streamsStaging reports whether a staged reduction of n ranks in rounds
// of block bytes copies into the staging buffers around the caches: when
// one round's blocks of every rank together reach stageStreamAll, the
// caches cannot hold them until the peers read them, and writing them
// through the caches would only read each destination line from memory
// first. That is the case of ranks that outnumber the CPUs, whose blocks
// are crowdedStageBlock bytes. On a 2-core AMD Zen 4 machine (32 MiB of
// level-3 cache, 2026-12-03, tandem bench allreduce -backend auto -nproc
// 4 -sizes 16M,64M -iters 20, three alternating runs) 16 MiB took 9.0-10.4
// ms streamed against 11.7-12.0 through the caches, and 64 MiB 37.2-42.5
// against 43.8-49.3.
func streamsStaging(n, block int) bool {
	return n*block >= stageStreamAll
}

// cachedPiece bounds the pieces copyCached copies: below the size from
// which the runtime's copy writes around the caches (1 MiB on amd64).
const cachedPiece = 512 << 10

// copyCached copies src to dst in pieces that the runtime copies through
// the caches, where a peer reads them soon after: staged data is written
// by one rank and read by the others within the block.
func copyCached(dst, src []byte) {
	for len(src) > cachedPiece {
		copy(dst[:cachedPiece], src[:cachedPiece])
		dst, src = dst[cachedPiece:], src[cachedPiece:]
	}
	copy(dst, src)
}
