//go:build linux && race

package shm

import (
	"runtime"
	"sync"
	"unsafe"
)

// The race detector neither tracks memory outside the Go heap nor counts
// atomics on such memory as synchronisation, so it cannot see that a
// receive's copy out of a ring follows the send's copy in. When ranks are
// goroutines of one process (as in the tests), the chain "rank A reads its
// buffer, sends, rank B receives, replies, rank A's reader writes the
// buffer" would then look like a race. Each channel therefore has an anchor
// on the Go heap, shared by every mapping of the segment in this process:
// publishing a head or tail releases it, observing one acquires it.
//
// Between separate processes the chain's middle runs where this process's
// detector cannot see it, so its two ends ("rank A's sender reads its
// buffer", "rank A's reader later writes a reply into it", as a ring
// all-reduce does with every chunk) would look like a race too. Each
// transport therefore also has an anchor of its own (Transport.own): every
// send releases it after copying, every receive acquires it before copying
// out, so a rank's sends happen before its later receives. That is what the
// ranks' protocols guarantee whenever a receive's data depends on a send
// (the only case where the buffers meet); its cost is that a genuine race
// between a send from a buffer and an unrelated receive into the same
// buffer goes unreported over shared memory (the TCP backend reports it).

type anchorKey struct {
	dev, ino uint64
	off      int
}

// anchors holds one anchor per channel of every segment mapped in this
// process; it exists only in race-detector builds.
var anchors sync.Map // anchorKey → *uint64

func (s *segment) anchor(off int) unsafe.Pointer {
	v, _ := anchors.LoadOrStore(anchorKey{s.dev, s.ino, off}, new(uint64))
	return unsafe.Pointer(v.(*uint64))
}

func raceRelease(p unsafe.Pointer) { runtime.RaceReleaseMerge(p) }
func raceAcquire(p unsafe.Pointer) { runtime.RaceAcquire(p) }
