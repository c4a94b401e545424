// Package recvbuf gives received tensors their memory: memory the receiver
// overwrites in full, so never zeroed, and for large tensors recycled from
// tensors the program has dropped (rpc's receive path uses it).
package recvbuf

import (
	"math/bits"
	"reflect"
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"unsafe"

	"gorgonia.org/tensor"
)

// Memory for received tensors.
//
// Received tensors are overwritten whole (from the socket or from the
// sender's memory) before anyone sees them, so zeroing their memory first
// is wasted work: for large tensors it costs about as much as the copy
// itself. The runtime's allocator can skip it; mallocgc is reached by
// linkname, as its documentation allows (go.dev/issue/67401).
//
// Fresh memory is dear too: the first touch of each page faults, and the
// kernel zeroes it (about 0.3 ms per MiB on a busy machine, more than the
// copy), and every few megabytes allocated start a garbage collection. So
// large receive buffers are recycled: each carries a finalizer that, once
// the tensor and every slice of its memory are unreachable, puts the buffer
// on a free list instead of letting it go, and the next tensor of that size
// class reuses it, its pages already mapped. The free lists hold at most
// recycleCap bytes in all, making room for the sizes received lately;
// buffers beyond that are freed as usual. A buffer is only ever reused
// after the collector has proved that nothing refers to it, so user code
// that keeps a received tensor, or any slice of its data, keeps it for
// good.
//
// Recycling through the collector has a trap: buffers that a program drops
// come back only after a collection, and the runtime paces collections by
// the live heap, which counts the free lists themselves. A program that
// receives large tensors and drops them (an echo loop, a parameter server
// answering pulls) uses up a free list long before the next collection is
// due, so every receive after that gets fresh memory: page faults and the
// kernel's zeroing, and on a virtual machine whose memory the host backs
// lazily, the host's faults too. A 4 MiB echo took 12 ms instead of 1.3 in
// some runs, and tens of milliseconds one call in ten on a busy machine.
// So when a free list runs low while buffers handed out earlier may be
// garbage, the recycler starts a collection itself, in the background,
// which hands those buffers back before the list is empty (collectSoon). It does so only when the buffers
// handed out since its last collection outweigh what the collector would
// have to scan (the program's scannable heap), so that a collection costs
// less than faulting in that much fresh memory; and when a collection it
// started brought nothing back (the program keeps what it receives), it
// waits for twice as many bytes before the next.
//
// It starts the collection the way the runtime starts its own, by
// allocation (startCollection), not with runtime.GC: runtime.GC waits for
// the mark and then for the whole sweep, calling Gosched in a loop while it
// waits, and with two Ps that loop keeps one P busy and never steals the
// goroutines queued on the other. In a 4 MiB echo between two processes of
// two Ps each the receiving goroutine, woken during the collection, sat
// queued behind a mark worker for 5 ms while the goroutine in runtime.GC
// spun on the other P; the plain echo's p99 was 4.3 to 5.0 ms with
// runtime.GC and 2.6 to 3.4 ms with startCollection (1000 calls a run,
// three runs each, on the 2-core development machine).

//go:linkname mallocgc runtime.mallocgc
func mallocgc(size uintptr, typ unsafe.Pointer, needzero bool) unsafe.Pointer

const (
	// uninitFrom is the size from which received tensors skip zeroing.
	uninitFrom = 64 << 10
	// recycleFrom is the size from which receive buffers are recycled.
	recycleFrom = 256 << 10
	// recycleCap bounds the bytes kept on the free lists.
	recycleCap = 64 << 20
	// hugePage is the size of a transparent huge page; blockAlign is the
	// alignment the runtime gives large blocks (its page size).
	hugePage   = 2 << 20
	blockAlign = 8 << 10
	// lowWater: a get that finds this many bytes of buffers of its size or
	// fewer on the free list may start a collection (collectSoon): six
	// buffers of 4 MiB, one of 16 MiB (the free lists hold four of those).
	lowWater = 24 << 20
	// collectMin and collectMax bound the bytes handed out between two
	// collections the recycler starts. Each collection costs the calls it
	// overlaps a few milliseconds on a busy machine, so the recycler keeps
	// enough buffers to collect once per several receives: a 4 MiB echo
	// between two processes ran 1.5 ms at the median with a collection
	// every six receives, 1.9 ms with one every receive (tandem bench rpc,
	// 2026-11-24, three runs each).
	collectMin = 24 << 20
	collectMax = 1 << 30
)

// NewTensor returns a tensor of dtype dt and shape whose size bytes the
// caller overwrites in full before anyone else sees them, and, when its
// memory comes from the receive buffers, the block to Release once the
// tensor is known to be dropped.
func NewTensor(dt tensor.Dtype, shape []int, size uint64) (*tensor.Dense, Block) {
	es := uint64(dt.Size())
	if size < uninitFrom || len(shape) == 0 || es == 0 || size%es != 0 {
		return tensor.New(tensor.Of(dt), tensor.WithShape(shape...)), Block{}
	}
	// The element types that travel hold no pointers: the memory is noscan.
	var p unsafe.Pointer
	var blk Block
	if size >= recycleFrom {
		blk = receiveBuffers.get(uintptr(size))
		p = bufferStart(blk.base, blk.class)
	} else {
		p = mallocgc(uintptr(size), nil, false)
	}
	backing := reflect.SliceAt(dt.Type, p, int(size/es)).Interface()
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing)), blk
}

// Block is a receive buffer's block: its base (the object the finalizer
// watches) and its size class. The zero value is no block.
type Block struct {
	base  unsafe.Pointer
	class uintptr
}

// recycler keeps large receive buffers for reuse, by size class.
type recycler struct {
	mu    sync.Mutex
	bytes uintptr
	free  map[uintptr][]unsafe.Pointer // by class size
	// prefill: buffers to make when a class's list is found empty;
	// filling: the classes being filled; filled: the classes filled
	// since their list last gave way to other sizes (makeRoom), whose
	// list found empty gets refillBytes more; stopgaps: the addresses of
	// blocks handed out fresh while that buffer is made, let go when
	// they come back (a pointer would keep them reachable).
	prefill  int
	filling  map[uintptr]bool
	filled   map[uintptr]bool
	stopgaps map[uintptr]bool

	// For collectSoon: out is the bytes of the blocks handed out and not
	// yet back; handed, the bytes handed out since the last collection
	// this recycler started, which needs every bytes before the next;
	// returned, the bytes back since then; collecting, whether one is
	// being started; collected, whether one was. collect starts a
	// collection (startCollection).
	out, handed, returned, every uintptr
	collecting, collected        bool
	collect                      func()
}

// receiveBuffers is this process's cache of receive buffers, shared by its
// agents like a sync.Pool.
var receiveBuffers = newRecycler(prefill)

func newRecycler(prefill int) *recycler {
	return &recycler{free: map[uintptr][]unsafe.Pointer{}, prefill: prefill, filling: map[uintptr]bool{}, filled: map[uintptr]bool{}, stopgaps: map[uintptr]bool{},
		every: collectMin, collect: startCollection}
}

// sizeClass rounds n up to 1, 1.25, 1.5 or 1.75 times a power of two, so a
// buffer serves sizes up to a quarter smaller than itself.
func sizeClass(n uintptr) uintptr {
	shift := bits.Len64(uint64(n-1)) - 3 // quarter steps of the power of two below
	if shift < 0 {
		return n
	}
	step := uintptr(1) << shift
	return (n + step - 1) &^ (step - 1)
}

// get returns a block holding a buffer of at least n bytes (at
// bufferStart) whose contents are undefined.
func (r *recycler) get(n uintptr) Block {
	class := sizeClass(n)
	r.mu.Lock()
	collect := r.collectSoon(class)
	if l := r.free[class]; len(l) > 0 {
		base := l[len(l)-1]
		l[len(l)-1] = nil
		r.free[class] = l[:len(l)-1]
		r.bytes -= class
		r.mu.Unlock()
		if collect {
			go r.collectGarbage()
		}
		r.watch(base, class)
		return Block{base, class}
	}
	// The list of this size is empty. The first time, buffers of other
	// sizes make room for a fill of prefill buffers, as they do for a
	// buffer that comes back (put), since the size received now is the
	// one likely to come again. Once filled, a list found empty is a
	// little short (a collection that took longer than the receives
	// allowed, or buffers the program keeps): it gets refillBytes more.
	// A fill of six 4 MiB buffers there mapped their huge pages while the
	// calls ran (the kernel takes up to 12 ms for 4 MiB on a virtual
	// machine whose host faults them in) and held up about eight calls of
	// a 4 MiB echo for 6 to 12 ms each.
	more, stopgap := r.fillCount(class), r.filled[class]
	if more > 0 && !r.makeRoom(class, uintptr(more)*class) {
		more = 0
	}
	if more > 0 {
		r.filling[class], r.filled[class] = true, true
	}
	r.mu.Unlock()
	if more > 0 {
		go r.fill(class, more)
	}
	if collect {
		go r.collectGarbage()
	}
	// No huge pages here: see newBlock. Once the list has been filled, this
	// block only stands in for the buffer being made: its small pages
	// would slow the copies into it (their misses in the TLB) each time it
	// served again.
	base := newBlock(class, false)
	if stopgap {
		r.mu.Lock()
		r.stopgaps[uintptr(base)] = true
		r.mu.Unlock()
	}
	r.watch(base, class)
	return Block{base, class}
}

// collectSoon counts a block of class bytes as handed out and says whether
// to start a collection (collectGarbage), marking it under way: when the
// free list of class is at its low water, other blocks are out that may be
// garbage, no collection is under way, and enough bytes went out since the
// last. The caller holds r.mu.
func (r *recycler) collectSoon(class uintptr) bool {
	others := r.out
	r.out += class
	r.handed += class
	if uintptr(len(r.free[class]))*class > lowWater || others == 0 || r.collecting || r.handed < r.every {
		return false
	}
	r.collecting = true
	return true
}

// collectGarbage runs a collection, so that the finalizers of the blocks
// nothing refers to any more put them back on the free lists, unless the
// collector would have more to scan than the bytes handed out since the
// last one.
func (r *recycler) collectGarbage() {
	r.mu.Lock()
	handed := r.handed
	r.mu.Unlock()
	if scan := scannableBytes(); scan > uint64(handed) {
		r.mu.Lock()
		r.collecting = false
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	// Nothing came back since the last collection: the program keeps what
	// it receives, so collect half as often; otherwise as often as allowed.
	if r.collected && r.returned == 0 {
		r.every = min(2*r.every, collectMax)
	} else {
		r.every = collectMin
	}
	r.handed, r.returned, r.collected = 0, 0, true
	r.mu.Unlock()
	r.collect()
	r.mu.Lock()
	r.collecting = false
	r.mu.Unlock()
}

// startCollection starts a garbage collection and returns without waiting
// for it, the way the runtime starts its own: by allocation. It allocates,
// and drops, blocks until the heap passes the point at which the runtime's
// pacer starts a collection (a large allocation always checks), at most the
// runtime's heap goal less the heap the last collection found live, which
// the heap has only grown from since. The blocks are never written, so they
// cost address space and no memory, and the collection frees them; all but
// the last, which is still in the allocator's hands when the collection
// starts and so survives it (what the collector finds referenced while it
// marks, it keeps). It allocates in pieces (nudgePieces of the way, at
// least nudgeMin each) and stops once a collection has started, so that
// piece is small; but up to half of the way in one piece, unchecked, since
// the pacer never starts a collection before the heap has grown 70% of the
// way (the lower bound of its trigger), and the checks between pieces cost
// more than the pieces (heapStarted, below). The work runs on
// the processor the calls need: with one processor a process, the whole
// way in pieces (ten of 4 MiB), each checked with heapState, took 190-370
// µs on a heap of 40 MiB; half at once and the light checks, 70-100 µs
// (AMD Zen 4, 2026-12-02).
//
// While a collection is marking it does nothing: that collection brings
// back what is garbage. Far from the goal (more than nudgeMax), or with
// collections off (GOGC=off), it runs runtime.GC instead.
func startCollection() {
	goal, live, cycles, marking := heapState()
	switch {
	case marking:
		return
	case goal == 0 || goal < live || goal-live > nudgeMax:
		runtime.GC()
		return
	}
	need := goal - live + nudgeMargin
	piece := max(need/nudgePieces, nudgeMin)
	// The heap has grown since the last collection: the first piece takes
	// it to half the way, no further.
	done := uint64(0)
	if half, cur := live+need/2, heapObjects(); cur < half {
		done = half - cur
		mallocgc(uintptr(done), nil, false)
	}
	for ; done < need; done += piece {
		mallocgc(uintptr(piece), nil, false)
		if c, m := heapStarted(); m || c != cycles {
			return
		}
	}
}

// heapObjects is the heap's objects now, live or not yet swept: where the
// pacer stands on its way from the live heap to the goal (0 where the
// runtime does not say, which makes startCollection's first piece the
// whole half).
func heapObjects() uint64 { return uint64Metric("/memory/classes/heap/objects:bytes") }

// uint64Metric reads the runtime metric name, 0 where the runtime does not
// have it as a uint64.
func uint64Metric(name string) uint64 {
	s := []rtmetrics.Sample{{Name: name}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// started holds heapStarted's samples, allocated once: an allocation
// while a collection has just started marking would make this goroutine
// do some of the marking first.
var started = struct {
	sync.Mutex
	s []rtmetrics.Sample
}{s: []rtmetrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/pauses/total/gc:seconds"}}}

// heapStarted is the part of heapState that startCollection checks
// between pieces, without allocating: the collections finished and whether
// one is marking.
func heapStarted() (cycles uint64, marking bool) {
	started.Lock()
	defer started.Unlock()
	s := started.s
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 || s[1].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0, true // unknown: stop, as if a collection had started
	}
	cycles = s[0].Value.Uint64()
	return cycles, collectorStops(s[1].Value) == 2*cycles+1
}

// What startCollection allocates: at most nudgeMax (address space it never
// touches, gone at the next sweep; further from the goal than that it runs
// runtime.GC), nudgeMargin beyond the goal, in nudgePieces pieces of at
// least nudgeMin.
const (
	nudgeMax    = 1 << 30
	nudgeMargin = 1 << 20
	nudgePieces = 64
	nudgeMin    = 4 << 20
)

// heapState returns the heap size at which the runtime means to have
// finished its next collection, the heap that the last collection found
// live, the collections finished so far, and whether one is marking now.
// Each collection stops the world twice, when it starts marking and when it
// ends, and counts itself finished during the second stop: a collection is
// marking when the collector's stops number one more than twice the
// collections finished.
func heapState() (goal, live, cycles uint64, marking bool) {
	s := []rtmetrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: "/gc/heap/live:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/pauses/total/gc:seconds"}}
	rtmetrics.Read(s)
	for _, v := range s[:3] {
		if v.Value.Kind() != rtmetrics.KindUint64 {
			return 0, 0, 0, false
		}
	}
	cycles = s[2].Value.Uint64()
	return s[0].Value.Uint64(), s[1].Value.Uint64(), cycles, collectorStops(s[3].Value) == 2*cycles+1
}

// collectorStops is how many times the collector has stopped the world, from
// the histogram of its pauses (0 where v is not one).
func collectorStops(v rtmetrics.Value) uint64 {
	if v.Kind() != rtmetrics.KindFloat64Histogram {
		return 0
	}
	var stops uint64
	for _, c := range v.Float64Histogram().Counts {
		stops += c
	}
	return stops
}

// scannableBytes is the memory the collector scans: the program's heap
// that may hold pointers, its stacks and globals.
func scannableBytes() uint64 { return uint64Metric("/gc/scan/total:bytes") }

// Release puts a block that NewTensor handed out back on its free list at
// once, without waiting for the collector: its owner vouches that nothing
// refers into it any more (in rpc, a function registered with
// ReuseArgMemory has returned). The zero Block is ignored.
func Release(b Block) { receiveBuffers.release(b) }

// Free reports whether the receive buffer whose data starts at addr is on a
// free list, ready for the next tensor of its size (for tests).
func Free(addr uintptr) bool {
	r := receiveBuffers
	r.mu.Lock()
	defer r.mu.Unlock()
	for class, list := range r.free {
		for _, base := range list {
			if uintptr(bufferStart(base, class)) == addr {
				return true
			}
		}
	}
	return false
}

// release puts a block back on its free list at once (see Release). The
// block goes on
// top of its list, so the next receive of that size reuses the memory
// touched last, still in the CPU's caches.
func (r *recycler) release(b Block) {
	if b.base == nil {
		return
	}
	runtime.SetFinalizer((*byte)(b.base), nil)
	r.put(b.base, b.class)
}

// prefill is how many buffers a receive that finds its free list empty
// for the first time has made in the background, their pages mapped
// there: fresh memory costs page faults and the kernel's zeroing, which the
// next receives then skip (on another core, while this one copies). A
// 4 MiB echo keeps about fifteen buffers in use a process (handed out
// between collections, and on the list for the time a collection takes to
// hand them back, 2 ms at the median and up to 7); with six filled it
// found its list empty again in 1 to 4 of the first 150 timed calls,
// each a fresh block and a buffer more, in the calls after the first
// fill, with twelve in none of those of 7 runs of 1000 (median p99 1.8
// ms against 2.1, p50 0.68 against 0.75).
const prefill = 12

// refillBytes is about how much a list found empty after its first fill
// gets: one buffer of 4 MiB, six of 1 MiB. The buffers of a fill are
// mapped while the calls run, and a 1 MiB echo, which collects every 24
// receives, needs more of them than the first fill makes: with one at a
// time its p99 was 2.3 to 2.7 ms against 1.7 to 2.2 with six.
const refillBytes = 6 << 20

// minFill is the fewest buffers a first fill makes: sizes of which fewer
// fit under recycleCap (from 12 MiB) get none, as the cap keeps too few
// of them for a fill to pay (a 16 MiB echo filled with three took 13 to
// 16 ms at the p99 against 7 unfilled). A fill of as many as fit, up to
// prefill, serves the sizes below.
const minFill = 6

// populatePiece is how much of a fresh buffer fill maps at a time, with
// the process's other goroutines let run between pieces. Mapping pages
// takes the kernel's zeroing, and a process of one processor runs nothing
// else meanwhile (the runtime takes the processor back from a thread in a
// system call only when its monitor next looks, which in a busy process of
// raw system calls is up to 10 ms): six 1 MiB buffers mapped at once held
// up a 1 MiB echo's calls for 2 to 4.6 ms, in 3 of 200 calls a run.
const populatePiece = 256 << 10

// fillCount is how many buffers a get that finds the list of class empty
// has made: none while a fill of it runs, prefill (as many as fit under
// recycleCap, none below minFill) the first time, refillBytes' worth once
// it has been filled. The caller holds r.mu.
func (r *recycler) fillCount(class uintptr) int {
	switch {
	case r.prefill == 0 || r.filling[class]:
		return 0
	case r.filled[class]:
		return max(1, int(refillBytes/class))
	}
	n := min(r.prefill, int(recycleCap/class))
	if n < min(r.prefill, minFill) {
		return 0 // too large to keep enough of
	}
	return n
}

// fill adds n fresh buffers of class bytes to the free list.
func (r *recycler) fill(class uintptr, n int) {
	for i := 0; i < n; i++ {
		base := newBlock(class, true)
		start := bufferStart(base, class)
		for off := uintptr(0); off < class; off += populatePiece {
			populate(unsafe.Add(start, off), min(populatePiece, class-off))
			runtime.Gosched()
		}
		r.mu.Lock()
		if !r.makeRoom(class, class) {
			r.mu.Unlock()
			break
		}
		// At the bottom: blocks released or recycled meanwhile, used a
		// moment ago and warm in the caches, go first.
		r.free[class] = append([]unsafe.Pointer{base}, r.free[class]...)
		r.bytes += class
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.filling[class] = false
	r.mu.Unlock()
}

// newBlock allocates a block for a buffer of class bytes. Buffers of a
// huge page or more start on a huge-page boundary inside their block, so
// that all their pages can be huge pages (the slack is address space they
// never touch); with huge set, the kernel is asked to back them with huge
// pages.
//
// Only the background fill asks for huge pages. A huge page's first touch
// can cost far more than the 512 small pages it replaces: the kernel takes
// a free 2 MiB block for it, and on a virtual machine whose guest hands its
// free 2 MiB blocks back to the host (virtio-balloon's free page
// reporting), each such block is fresh memory to the host, which faults it
// in again: 12 ms for 4 MiB on the development machine, against 0.5 ms for
// huge pages the guest had used lately and 1.5 to 2 ms for small pages. A
// receive that finds its free list empty must not wait for that; the
// buffers filled in the background may.
func newBlock(class uintptr, huge bool) unsafe.Pointer {
	slack := uintptr(0)
	if class >= hugePage {
		slack = hugePage - blockAlign
	}
	base := mallocgc(class+slack, nil, false)
	if huge {
		hugePageHint(bufferStart(base, class), class)
	}
	return base
}

// bufferStart is where the buffer of class bytes in the block at base
// starts.
func bufferStart(base unsafe.Pointer, class uintptr) unsafe.Pointer {
	if class < hugePage {
		return base
	}
	return unsafe.Add(base, (hugePage-uintptr(base)%hugePage)%hugePage)
}

// watch arranges for the block at base, holding a buffer of class bytes,
// to come back to the free list once nothing refers into it. (The
// finalizer must not capture base: that would keep the block reachable.)
func (r *recycler) watch(base unsafe.Pointer, class uintptr) {
	runtime.SetFinalizer((*byte)(base), func(b *byte) { r.put(unsafe.Pointer(b), class) })
}

// put keeps an unreachable block for reuse. When the free lists are full
// it makes room by letting blocks of other sizes go (the sizes received
// lately are the ones likely to come again), or lets this one go.
func (r *recycler) put(base unsafe.Pointer, class uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out -= min(r.out, class)
	r.returned += class
	if r.stopgaps[uintptr(base)] {
		delete(r.stopgaps, uintptr(base))
		return
	}
	if !r.makeRoom(class, class) {
		return
	}
	r.free[class] = append(r.free[class], base)
	r.bytes += class
}

// makeRoom lets buffers of sizes other than class go from the free lists
// until need more bytes fit under recycleCap, and reports whether they do.
// The caller holds r.mu.
func (r *recycler) makeRoom(class, need uintptr) bool {
	if need > recycleCap {
		return false
	}
	for other, l := range r.free {
		if r.bytes+need <= recycleCap {
			break
		}
		if other == class {
			continue
		}
		for len(l) > 0 && r.bytes+need > recycleCap {
			l[len(l)-1] = nil
			l = l[:len(l)-1]
			r.bytes -= other
		}
		if len(l) == 0 {
			delete(r.free, other)
			delete(r.filled, other) // gave way: the next receive of it fills again
		} else {
			r.free[other] = l
		}
	}
	return r.bytes+need <= recycleCap
}

// Valid reports whether b is a block (not the zero Block).
func (b Block) Valid() bool { return b.base != nil }

// Class is the size of the buffer that a receive of n bytes is given: n
// rounded up to a size class.
func Class(n uint64) uint64 { return uint64(sizeClass(uintptr(n))) }

// Landing returns a receive buffer of Class(size) bytes, whose contents are
// undefined, and its block, for memory that another process is to write
// into (rpc's pushed tensors): until TensorOn makes a tensor of it, the
// caller keeps the block reachable (or quarantined) itself.
func Landing(size uint64) ([]byte, Block) {
	blk := receiveBuffers.get(uintptr(size))
	return unsafe.Slice((*byte)(bufferStart(blk.base, blk.class)), blk.class), blk
}

// TensorOn returns a tensor of dtype dt and shape whose data is the first
// bytes of mem (from Landing), which must hold them.
func TensorOn(dt tensor.Dtype, shape []int, mem []byte) *tensor.Dense {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n == 0 || len(mem) == 0 {
		return tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	}
	backing := reflect.SliceAt(dt.Type, unsafe.Pointer(&mem[0]), n).Interface()
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(backing))
}

// Quarantine keeps the block b, and keep, out of every other use until
// free reports true: memory that another process may still write into
// (its writes were granted and could not be shown to be over) must never
// be handed to the allocator again, where they would land in unrelated
// objects. free is asked at each later call, and is called with no lock
// held; once it reports true the block goes back to the free lists. The
// zero Block is ignored.
func Quarantine(b Block, keep any, free func() bool) {
	if b.base == nil {
		return
	}
	runtime.SetFinalizer((*byte)(b.base), nil)
	q := &quarantined
	q.mu.Lock()
	all := append(q.held, quarantinedBlock{b, keep, free})
	q.held = nil
	q.mu.Unlock()
	var still []quarantinedBlock
	for _, h := range all {
		if h.free() {
			receiveBuffers.put(h.b.base, h.b.class)
			continue
		}
		still = append(still, h)
	}
	q.mu.Lock()
	q.held = append(q.held, still...)
	q.mu.Unlock()
}

// Quarantined reports how many blocks Quarantine still holds (for tests).
func Quarantined() int {
	q := &quarantined
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.held)
}

// quarantinedBlock is a block Quarantine holds.
type quarantinedBlock struct {
	b    Block
	keep any
	free func() bool
}

// quarantined is this process's quarantine, like receiveBuffers one for
// all its agents: a block held there outlives whatever quarantined it.
var quarantined struct {
	mu   sync.Mutex
	held []quarantinedBlock
}

// Marking reports whether a garbage collection is marking now (about 0.2
// µs, no allocation). rpc's polling reads park at once while one is, so
// that the collector's idle worker gets the processor during the wait.
func Marking() bool {
	_, m := heapStarted()
	return m
}
