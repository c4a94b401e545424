package tcp

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/transport"
)

// A frame is a 24-byte header followed by length payload bytes:
//
//	kind u8 | 7 reserved bytes | tag u64 | length u64   (little endian)
const headerSize = 24

// Frame kinds.
const (
	frameData  = 1 // a message under tag
	frameAbort = 2 // the sender aborted; the payload is the cause as text
	frameBye   = 3 // the sender closed its transport; nothing follows
	// frameRef is a message left in the sender's memory (singlecopy.go):
	// the length field is the message's, and a 16-byte body follows with
	// the message's address and an acknowledgement id.
	frameRef = 4
	// frameAck acknowledges a reference frame: the tag field holds its id,
	// the length field a status; nothing follows.
	frameAck = 5
	// frameHeartbeat proves the sender alive on a link that carries nothing
	// else (see liveness.go); nothing follows. The length field is the
	// interval in milliseconds at which the sender wants to hear from the
	// receiver (0: it does not check), so that ranks configured with
	// different timeouts still keep each other's checks satisfied.
	frameHeartbeat = 6
)

// maxCauseLen bounds the cause text carried by an abort frame.
const maxCauseLen = 4 << 10

func putHeader(b *[headerSize]byte, kind byte, tag transport.Tag, n uint64) {
	b[0] = kind
	clear(b[1:8])
	binary.LittleEndian.PutUint64(b[8:], uint64(tag))
	binary.LittleEndian.PutUint64(b[16:], n)
}

func parseHeader(b *[headerSize]byte) (kind byte, tag transport.Tag, n uint64) {
	return b[0], transport.Tag(binary.LittleEndian.Uint64(b[8:])), binary.LittleEndian.Uint64(b[16:])
}

// message is a payload that arrived before its Recv was posted.
type message struct {
	data []byte // the payload; cap is the pool class size
	err  error  // set instead of data for a message that could not be kept
	// A message by reference (ref.id != 0) is still in the sender's
	// memory: the Recv that takes it copies it, unless the timer has
	// started to copy it into data (copying, closed when it has).
	ref     remoteRef
	timer   *time.Timer
	copying chan struct{}
}

// msgPool recycles message buffers by power-of-two size class, so the
// unexpected-message path allocates only while the pool warms up.
type msgPool struct {
	classes [64]sync.Pool
}

func sizeClass(n int) int {
	if n <= 64 {
		return 6
	}
	return bits.Len(uint(n - 1))
}

func (mp *msgPool) get(n int) *message {
	c := sizeClass(n)
	if m, ok := mp.classes[c].Get().(*message); ok {
		m.data = m.data[:n]
		m.ref, m.timer, m.copying = remoteRef{}, nil, nil
		return m
	}
	return &message{data: make([]byte, n, 1<<c)}
}

func (mp *msgPool) put(m *message) {
	if m.err != nil || cap(m.data) == 0 {
		return
	}
	c := sizeClass(cap(m.data))
	if cap(m.data) != 1<<c {
		return
	}
	mp.classes[c].Put(m)
}

// recvReq is a posted Recv waiting for its message.
type recvReq struct {
	buf  []byte
	done chan error // capacity 1; receives the outcome exactly once
	// ref, set before a nil outcome, is a message the Recv copies from the
	// sender's memory itself.
	ref remoteRef
}

// tagQueue holds, for one (peer, tag), either posted receives or arrived
// messages (never both at once), each in arrival order.
type tagQueue struct {
	posted []*recvReq
	ready  []*message
}

func (q *tagQueue) popPosted() *recvReq {
	r := q.posted[0]
	copy(q.posted, q.posted[1:])
	q.posted[len(q.posted)-1] = nil
	q.posted = q.posted[:len(q.posted)-1]
	return r
}

func (q *tagQueue) popReady() *message {
	m := q.ready[0]
	copy(q.ready, q.ready[1:])
	q.ready[len(q.ready)-1] = nil
	q.ready = q.ready[:len(q.ready)-1]
	return m
}

// removePosted takes r out of the posted list and reports whether it was there.
func (q *tagQueue) removePosted(r *recvReq) bool {
	for i, x := range q.posted {
		if x == r {
			copy(q.posted[i:], q.posted[i+1:])
			q.posted[len(q.posted)-1] = nil
			q.posted = q.posted[:len(q.posted)-1]
			return true
		}
	}
	return false
}

func (q *tagQueue) empty() bool { return len(q.posted) == 0 && len(q.ready) == 0 }
