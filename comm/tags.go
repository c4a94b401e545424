package comm

import "github.com/tandemml/tandem/comm/transport"

// Tag layout (64 bits), so that no two operations ever take each other's
// messages:
//
//	collective:     0 | group id (15) | sequence (32) | step (16)
//	point-to-point: 1 | group id (15) | user tag (48)
//
// The sequence number is the group's collective counter (it wraps after 2^32
// collectives, far more than can be in flight at once); the step separates the
// messages of one collective's phases.
const (
	maxGroupID  = 1<<15 - 1
	maxUserTag  = 1<<48 - 1
	p2pTagBit   = 1 << 63
	stepFinger  = 0xFFFF // the fingerprint exchange of a collective
	stepMonitor = 0xFFFE // monitored barrier's replies
)

func collectiveTag(gid uint32, seq uint32, step uint16) transport.Tag {
	return transport.Tag(uint64(gid)<<48 | uint64(seq)<<16 | uint64(step))
}

func p2pTag(gid uint32, tag int) transport.Tag {
	return transport.Tag(p2pTagBit | uint64(gid)<<48 | uint64(tag))
}
