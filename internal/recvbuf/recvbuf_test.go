package recvbuf

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"testing"
	"time"
	"unsafe"

	"gorgonia.org/tensor"
)

// buf returns the buffer of a block from r.get.
func (r *recycler) buf(n uintptr) unsafe.Pointer {
	b := r.get(n)
	return bufferStart(b.base, b.class)
}

func TestSizeClass(t *testing.T) {
	for _, c := range []struct{ in, want uintptr }{
		{4 << 20, 4 << 20}, {4<<20 + 1, 5 << 20}, {5 << 20, 5 << 20}, {6<<20 - 1, 6 << 20},
		{7<<20 + 1, 8 << 20}, {256 << 10, 256 << 10}, {300 << 10, 320 << 10}, {5, 5},
	} {
		if got := sizeClass(c.in); got != c.want {
			t.Errorf("sizeClass(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

// waitFree collects garbage until r's free list holds want bytes, or a
// deadline passes; finalizers run on a goroutine of their own after a
// collection.
func waitFree(r *recycler, want uintptr) uintptr {
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := r.bytes
		r.mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			return n
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestRecyclerReusesOnlyUnreachableBuffers(t *testing.T) {
	r := newRecycler(0)
	const n = 1 << 20
	kept := unsafe.Slice((*byte)(r.buf(n)), n)
	dropped := uintptr(r.buf(n))
	kept[0], kept[n-1] = 7, 9
	if got := waitFree(r, n); got != n {
		t.Fatalf("%d bytes on the free list after the only reference went, want %d", got, n)
	}
	// The buffer still referenced must not come back; the dropped one must.
	if p := uintptr(r.buf(n)); p != dropped {
		t.Fatalf("get returned %#x, want the dropped buffer %#x", p, dropped)
	}
	if p := uintptr(r.buf(n)); p == uintptr(unsafe.Pointer(&kept[0])) || p == dropped {
		t.Fatalf("get returned a buffer in use (%#x)", p)
	}
	if kept[0] != 7 || kept[n-1] != 9 {
		t.Fatal("a buffer in use was changed")
	}
	runtime.KeepAlive(kept)
}

func TestRecyclerCap(t *testing.T) {
	r := newRecycler(0)
	const n = 16 << 20
	for i := 0; i < recycleCap/n+2; i++ {
		r.buf(n)
	}
	waitFree(r, recycleCap)
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	r.mu.Lock()
	got, lists := r.bytes, len(r.free[n])
	r.mu.Unlock()
	if got != recycleCap || lists != recycleCap/n {
		t.Fatalf("free list holds %d bytes in %d buffers, want the cap %d", got, lists, recycleCap)
	}
}

// TestReceiveTensorRecycled: a large received tensor's memory serves the
// next one once the first is garbage, and a slice of its data alone keeps
// it.
func TestReceiveTensorRecycled(t *testing.T) {
	const n = recycleFrom / 4
	first, _ := NewTensor(tensor.Float32, []int{n}, n*4)
	data := first.Data().([]float32)
	addr := uintptr(unsafe.Pointer(&data[0]))
	data[0] = 42
	first = nil
	// data still refers to the memory: a new tensor must get other memory.
	second, _ := NewTensor(tensor.Float32, []int{n}, n*4)
	if got := uintptr(unsafe.Pointer(&second.Data().([]float32)[0])); got == addr {
		t.Fatal("a tensor reused memory that a live slice refers to")
	}
	runtime.GC()
	if data[0] != 42 {
		t.Fatal("live memory changed")
	}
	runtime.KeepAlive(data)
	runtime.KeepAlive(second)
}

// TestRecyclerMakesRoomForNewSizes: free lists full of one size give way
// to another size that comes back later.
func TestRecyclerMakesRoomForNewSizes(t *testing.T) {
	r := newRecycler(0)
	const small, big = 1 << 20, 4 << 20
	for i := 0; i < recycleCap/small; i++ {
		r.put(mallocgc(small, nil, false), small)
	}
	r.put(mallocgc(big, nil, false), big)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bytes != recycleCap || len(r.free[big]) != 1 || len(r.free[small]) != recycleCap/small-big/small {
		t.Fatalf("free lists hold %d bytes: %d of %d B, %d of %d B", r.bytes, len(r.free[small]), small, len(r.free[big]), big)
	}
}

// TestRecyclerPrefills: a size whose free list is empty gets buffers made
// in the background, which the next gets return.
func TestRecyclerPrefills(t *testing.T) {
	r := newRecycler(2)
	const n = 4 << 20
	first := r.buf(n)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		have, filling := len(r.free[n]), r.filling[n]
		r.mu.Unlock()
		if have == 2 && !filling {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers made in the background (filling %v), want 2", have, filling)
		}
		time.Sleep(time.Millisecond)
	}
	a, b := r.buf(n), r.buf(n)
	if a == first || b == first || a == b {
		t.Fatal("prefilled buffers are not distinct fresh ones")
	}
	if uintptr(a)%hugePage != 0 || uintptr(b)%hugePage != 0 {
		t.Fatal("buffers of 4 MiB do not start on a huge-page boundary")
	}
	// Each is writable over its whole length.
	for _, p := range []unsafe.Pointer{first, a, b} {
		buf := unsafe.Slice((*byte)(p), n)
		buf[0], buf[n-1] = 1, 2
	}
}

// TestRecyclerRefillsOne: a 4 MiB list found empty after its fill gets one
// buffer more (refillBytes), not another fill, and the fresh block handed
// out meanwhile is let go when it comes back, while one handed out before
// the first fill is kept; once the size's buffers give way to another
// size's, it is filled in full again.
func TestRecyclerRefillsOne(t *testing.T) {
	r := newRecycler(2)
	const n, other = 4 << 20, 1 << 20
	waitFilled := func(class uintptr, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r.mu.Lock()
			have, filling := len(r.free[class]), r.filling[class]
			r.mu.Unlock()
			if have == want && !filling {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d buffers of %d B on the list (filling %v), want %d", have, class, filling, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Blocks are given back with release, as ReuseArgMemory's are: a
	// collection does not decide when.
	var out []Block
	defer func() {
		for _, b := range out {
			r.release(b)
		}
	}()
	out = append(out, r.get(n))
	waitFilled(n, 2)
	out = append(out, r.get(n), r.get(n)) // the two filled
	stopgap := r.get(n)                   // the list is empty again: a fill of one
	waitFilled(n, 1)
	r.release(stopgap)
	r.release(out[0])
	r.mu.Lock()
	have := len(r.free[n])
	r.mu.Unlock()
	if have != 2 {
		t.Fatalf("%d buffers of %d B on the list, want 2: the one filled and the first block, not the stopgap", have, n)
	}
	out = append(out[1:], r.get(n), r.get(n), r.get(n)) // the two, then empty again
	waitFilled(n, 1)
	// The list gives way to another size's buffers: a receive of the
	// first size fills it in full again.
	for i := 0; i < recycleCap/other; i++ {
		r.put(mallocgc(other, nil, false), other)
	}
	r.mu.Lock()
	have = len(r.free[n])
	r.mu.Unlock()
	if have != 0 {
		t.Fatalf("%d buffers of %d B left after the lists filled with %d B ones, want none", have, n, other)
	}
	out = append(out, r.get(n))
	waitFilled(n, 2)
}

// TestRecyclerPrefillMakesRoom: a size whose free list is empty while the
// lists are full of another size still gets its buffers made in the
// background; the other size's buffers give way.
func TestRecyclerPrefillMakesRoom(t *testing.T) {
	r := newRecycler(3)
	const small, big = 1 << 20, 4 << 20
	for i := 0; i < recycleCap/small; i++ {
		r.put(mallocgc(small, nil, false), small)
	}
	// Held to the end: dropped, a collection could put it on the list too.
	first := r.buf(big)
	defer runtime.KeepAlive(first)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		have, filling, smalls, bytes := len(r.free[big]), r.filling[big], len(r.free[small]), r.bytes
		r.mu.Unlock()
		if have == 3 && !filling {
			if want := (recycleCap - 3*big) / small; smalls != want || bytes != recycleCap {
				t.Fatalf("%d buffers of %d B left (want %d), %d bytes in all", smalls, small, want, bytes)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers of %d B made in the background (filling %v), want 3", have, big, filling)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRecyclerRelease: a released block is the next one handed out, at
// once and without a collection, and its finalizer no longer puts it back
// a second time.
func TestRecyclerRelease(t *testing.T) {
	r := newRecycler(0)
	const n = 4 << 20
	b := r.get(n)
	p := bufferStart(b.base, b.class)
	r.release(b)
	if got := r.buf(n); got != p {
		t.Fatalf("get after release returned %p, want the released buffer %p", got, p)
	}
	// Had the finalizer stayed, dropping the buffer now would put it on the
	// free list while it is in use again; the collector must not bring it
	// back while p is alive.
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	r.mu.Lock()
	free := len(r.free[n])
	r.mu.Unlock()
	if free != 0 {
		t.Fatalf("%d buffers on the free list while the only one is in use", free)
	}
	runtime.KeepAlive(p)
	r.release(Block{}) // the zero block is no block
}

// TestRecyclerCollectsDroppedBuffers: a loop that receives large buffers
// and drops them runs on a few recycled buffers, not on fresh memory, even
// when the runtime would not collect for a long while: with collections
// off (GOGC=off; the recycler runs runtime.GC), or with the heap far from
// its goal (a large live block; the recycler starts collections by
// allocation). The recycler starts the collections that bring the dropped
// buffers back.
func TestRecyclerCollectsDroppedBuffers(t *testing.T) {
	t.Run("gc-off", func(t *testing.T) {
		runtime.GC() // what earlier tests left, so that collections are cheap
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		recycleDropped(t)
	})
	t.Run("far-goal", func(t *testing.T) {
		runtime.GC()
		ballast := make([]byte, 512<<20)
		_, forced := gcCycles()
		recycleDropped(t)
		if _, got := gcCycles(); got != forced {
			t.Errorf("runtime.GC ran %d times; want the collections started by allocation", got-forced)
		}
		runtime.KeepAlive(ballast)
	})
}

func recycleDropped(t *testing.T) {
	r := newRecycler(0)
	// Until the buffers handed out outweigh the scannable heap the recycler
	// does not collect: the first few are fresh whatever it does.
	const n, calls = 4 << 20, 96
	seen := map[uintptr]bool{}
	for i := 0; i < calls; i++ {
		p := r.buf(n)
		clear(unsafe.Slice((*byte)(p), n)) // as a receive overwrites it
		seen[uintptr(p)] = true
		p = nil
		// A receive's worth of time, for the collection and the
		// finalizers running in the background.
		time.Sleep(2 * time.Millisecond)
	}
	r.mu.Lock()
	collected := r.collected
	r.mu.Unlock()
	if !collected || len(seen) > calls/2 {
		t.Fatalf("%d calls used %d distinct buffers (collected: %v, scannable heap %d bytes); want at most %d", calls, len(seen), collected, scannableBytes(), calls/2)
	}
}

// gcCycles returns the collections completed so far and how many of them
// runtime.GC forced.
func gcCycles() (total, forced uint64) {
	s := []rtmetrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/cycles/forced:gc-cycles"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// TestStartCollection: with the heap far from its goal (a large live block
// that nothing writes), nothing else would start a collection for a long
// while; startCollection starts one without runtime.GC and without waiting
// for it, and it completes, having kept no more than a piece of what
// startCollection allocated.
func TestStartCollection(t *testing.T) {
	runtime.GC()
	ballast := make([]byte, 256<<20)
	total, forced := gcCycles()
	startCollection()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, gotForced := gcCycles()
		if gotForced != forced {
			t.Fatalf("startCollection ran runtime.GC (forced collections %d -> %d); want a collection started by allocation", forced, gotForced)
		}
		if got > total {
			break
		}
		if time.Now().After(deadline) {
			goal, live, _, _ := heapState()
			t.Fatalf("no collection completed in 10 s after startCollection (heap goal %d, live %d bytes)", goal, live)
		}
		time.Sleep(time.Millisecond)
	}
	if _, live, _, _ := heapState(); live > uint64(len(ballast))+64<<20 {
		t.Errorf("the collection found %d bytes live, with %d of them the live block; want the blocks allocated to start it freed", live, len(ballast))
	}
	runtime.KeepAlive(ballast)
}

// TestStartCollectionGCOff: with collections off (GOGC=off) no allocation
// starts one; startCollection runs runtime.GC instead.
func TestStartCollectionGCOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	total, forced := gcCycles()
	startCollection()
	got, gotForced := gcCycles()
	if got <= total || gotForced <= forced {
		t.Fatalf("collections %d -> %d, forced %d -> %d; want runtime.GC's", total, got, forced, gotForced)
	}
}

// TestQuarantine: a quarantined block goes back to the free lists only
// once its release condition holds.
func TestQuarantine(t *testing.T) {
	mem, blk := Landing(1 << 20)
	free := false
	before := Quarantined()
	Quarantine(blk, nil, func() bool { return free })
	if Quarantined() != before+1 || Free(uintptr(unsafe.Pointer(&mem[0]))) {
		t.Fatal("the block is not held")
	}
	free = true
	_, other := Landing(1 << 20)
	Quarantine(other, nil, func() bool { return true })
	if Quarantined() != before || !Free(uintptr(unsafe.Pointer(&mem[0]))) {
		t.Fatalf("%d blocks held, want %d, and the freed one on its free list", Quarantined(), before)
	}
}

// TestMarking: Marking is true while a collection marks a heap that takes
// a while to mark, and false once it has finished.
func TestMarking(t *testing.T) {
	type node struct {
		next *node
		_    [6]*int
	}
	var head *node
	for i := 0; i < 1<<20; i++ {
		head = &node{next: head}
	}
	runtime.GC()
	seen := false
	for try := 0; try < 20 && !seen; try++ {
		done := make(chan struct{})
		go func() {
			runtime.GC()
			close(done)
		}()
	wait:
		for {
			select {
			case <-done:
				break wait
			default:
				if Marking() {
					seen = true
				}
				runtime.Gosched()
			}
		}
	}
	runtime.KeepAlive(head)
	if !seen {
		t.Fatal("Marking never reported the collections of a 64 MiB heap of pointers as marking")
	}
	if Marking() {
		t.Fatal("Marking reports a collection after runtime.GC has returned and nothing allocated since")
	}
}
