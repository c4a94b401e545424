package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/futex"
	"github.com/tandemml/tandem/internal/recvbuf"
	"github.com/tandemml/tandem/internal/samehost"
	"github.com/tandemml/tandem/internal/wire"
)

// Pushed tensors. A same-host copy (cma.go) is one copy, made by the
// receiver, while the sender waits: in a call it waits for the reply, in a
// reply for the acknowledgement. So a large tensor is copied by both: the
// receiver grants the sender memory for the next large tensor on the
// connection (a receive buffer of the size it received last, and four
// words), and the sender, once the frame that names the grant is written,
// writes the tensor into that memory itself (process_vm_writev) from the
// end down, while the receiver copies it from the start up; then it stores
// the grant's token in the completion word, which the receiver waits for.
// The copy runs on two cores instead of one.
//
// The two meet where they meet. Both copy in pieces of pushPiece on one
// grid (piece k is bytes [k·pushPiece, (k+1)·pushPiece)). Before each
// piece the receiver publishes how far it has claimed (the front word) and
// reads how much the sender has written (the tail word); the sender reads
// the front word (process_vm_readv) and, after each piece, writes the tail
// word. Each stops once the next piece is the other's: a side that is
// slowed (its core taken, its caches cold) leaves more to the other, in
// the same call. Both words are hints while the copy runs: a look may see
// a stale value, or a word half written, and then both sides copy the same
// piece, which writes the same bytes twice. Only the completion word, the
// last thing the sender writes, is trusted: after it the tail word is
// exact, and the receiver copies whatever lies between its front and the
// sender's tail itself.
//
// Only the receiver's own memory is written, at addresses the receiver
// named for the purpose, and only by the process the kernel named at the
// handshake (the same proof as for reading). Memory granted to a peer is
// never handed to anything else until the peer is known to be done with
// it: the completion word shows the token (or a failure), the peer let the
// grant go (revoked, or its connection closed, which it marks in the word),
// or its process is gone. A grant outstanding when the connection fails
// otherwise is quarantined (recvbuf.Quarantine) until one of those holds.

// pushFrom is the tensor size from which tensors are pushed.
const pushFrom = 1 << 20

// pushPiece is the unit in which the receiver and the sender of a pushed
// tensor claim its bytes: short enough (tens of microseconds) that the two
// finish close together, long enough that the sender's look at the front
// word and its write of the tail word, two small system calls a piece, cost
// little.
const pushPiece = 256 << 10

// The grant's words, at these offsets from the completion word, whose
// address the grant names (landing's layout; TestLandingLayout).
const (
	statusOffset = 8
	tailOffset   = 16
	frontOffset  = 24
)

// A grant's status word, which the sender writes before the completion
// word when it is not pushDone. The two are separate words, written by two
// system calls in order, because the kernel's copy into another process
// may store a word a byte at a time: a receiver that waits for the
// completion word to equal the token exactly cannot see it half written,
// and by then the status is in.
const (
	pushDone    = 0
	pushFailed  = 1 // the sender could not write its part: the receiver copies it
	pushAborted = 2 // the frame naming the grant did not go out whole
	pushRevoked = 3 // the sender let the grant go unused
)

// landWait bounds how long a receiver polls the completion word before it
// sleeps between looks, and the longest sleep.
const (
	landSpin     = 2 * time.Millisecond
	landSleepMax = time.Millisecond
	landPeerPoll = 10 * time.Millisecond
)

// landing is memory this side granted the peer, and its words, granted as
// one address: the completion word, then the status, the tail (the bytes at
// the end of the tensor the sender has written) and the front (the bytes at
// the start the receiver has claimed).
type landing struct {
	word   atomic.Uint64
	status atomic.Uint64
	tail   atomic.Uint64
	front  atomic.Uint64
	token  uint64
	mem    []byte
	blk    recvbuf.Block
}

// settled reports whether the peer is done with l: its completion word
// holds l's token.
func (l *landing) settled() bool { return l.word.Load() == l.token }

// landings is the receiving side of one connection's pushed tensors.
type landings struct {
	mu       sync.Mutex
	out      *landing // granted, not yet used or revoked
	revoking bool     // a revoke of out is on its way
	using    *landing // being received into (between Land and Receive's end)
	tokens   uint64
	want     uint64 // the size of the next grant: the last large tensor's class
	closed   bool
}

// peerGrant is memory the peer granted this side.
type peerGrant struct {
	token, addr, word, size uint64
}

// grants is the sending side of one connection's pushed tensors.
type grants struct {
	mu     sync.Mutex
	g      *peerGrant
	closed bool
}

// landingsFor returns the connection's Landings for ReadFrame, nil when it
// does not push.
func (c *conn) landingsFor() wire.Landings {
	if !c.pushOK {
		return nil
	}
	return (*connLandings)(c)
}

// connLandings is a conn seen as the wire's Landings.
type connLandings conn

// Land implements wire.Landings: the grant under token, for a tensor of
// size bytes.
func (cl *connLandings) Land(token, size uint64) ([]byte, recvbuf.Block, error) {
	c := (*conn)(cl)
	ls := &c.land
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.out
	if ls.closed {
		return nil, recvbuf.Block{}, fmt.Errorf("%w: rpc: connection to worker %s closed", ErrPeerLost, c.peer)
	}
	if l == nil || l.token != token {
		return nil, recvbuf.Block{}, wire.Malformed("worker %s pushed a tensor under grant %d, which is not outstanding", c.peer, token)
	}
	if size > uint64(len(l.mem)) {
		return nil, recvbuf.Block{}, wire.Malformed("worker %s pushed %d bytes into a grant of %d", c.peer, size, len(l.mem))
	}
	ls.out, ls.using = nil, l
	return l.mem, l.blk, nil
}

// Receive implements wire.Landings: it copies the tensor from the start
// into raw, on the read loop alone (the sender is the second core; a helper
// as well would contend with it), piece by piece until it meets the part
// the sender has written; then it waits for the sender's completion word,
// polling, then sleeping between looks, until the word is set, this
// connection closes, the peer's process is gone, or the agent's timeout
// passes; and it copies what neither has.
func (cl *connLandings) Receive(token uint64, raw []byte, addr uint64) error {
	c := (*conn)(cl)
	ls := &c.land
	ls.mu.Lock()
	l := ls.using
	ls.mu.Unlock()
	if l == nil || l.token != token {
		return wire.Malformed("no grant %d being received into", token)
	}
	n := uint64(len(raw))
	front := uint64(0)
	for front < n && front < n-min(l.tail.Load(), n) {
		end := min(front+pushPiece, n)
		l.front.Store(end)
		if err := c.copyIn(raw[front:end], addr+front); err != nil {
			return err
		}
		front = end
	}
	if !l.settled() {
		if err := c.awaitWord(l); err != nil {
			return err
		}
	}
	rest := uint64(0) // where the sender's part starts
	switch status := l.status.Load(); status {
	case pushDone:
		rest = n - min(l.tail.Load(), n)
	case pushFailed:
		rest = n
	case pushAborted:
		return fmt.Errorf("%w: rpc: worker %s abandoned the frame it pushed under grant %d", ErrPeerLost, c.peer, token)
	default:
		return wire.Malformed("worker %s ended its push under grant %d with status %d", c.peer, token, status)
	}
	if front < rest {
		if err := c.copyIn(raw[front:rest], addr+front); err != nil {
			return err
		}
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.using != l {
		// The connection closed meanwhile, and quarantined the memory.
		return fmt.Errorf("%w: rpc: connection to worker %s closed while it pushed a tensor", ErrPeerLost, c.peer)
	}
	ls.using = nil
	return nil
}

// copyIn copies len(dst) bytes at the peer's address addr into dst, on
// this goroutine alone.
func (c *conn) copyIn(dst []byte, addr uint64) error {
	if err := samehost.ReadAlone(c.peerPID, dst, addr); err != nil {
		return wire.Protocol(fmt.Errorf("copying %d bytes from worker %s (pid %d): %w", len(dst), c.peer, c.peerPID, err))
	}
	return nil
}

// awaitWord waits for l's completion word to show l's token.
func (c *conn) awaitWord(l *landing) error {
	start := time.Now()
	deadline := start.Add(c.a.opts.timeout)
	lastPeer := start
	sleep := 10 * time.Microsecond
	for i := 0; ; i++ {
		if l.settled() {
			return nil
		}
		if i%64 != 0 {
			// This process's other goroutines first, then the
			// other threads on this CPU: the peer may be one.
			futex.Yield()
			continue
		}
		select {
		case <-c.done:
			return fmt.Errorf("%w: rpc: connection to worker %s lost while it pushed a tensor", ErrPeerLost, c.peer)
		default:
		}
		now := time.Now()
		if now.After(deadline) {
			return fmt.Errorf("%w: rpc: worker %s did not push its part of a tensor within %v", ErrTimeout, c.peer, c.a.opts.timeout)
		}
		if now.Sub(lastPeer) >= landPeerPoll {
			lastPeer = now
			if processGone(c.peerPID) {
				return fmt.Errorf("%w: rpc: worker %s (pid %d) exited while it pushed a tensor", ErrPeerLost, c.peer, c.peerPID)
			}
		}
		if now.Sub(start) >= landSpin {
			time.Sleep(sleep)
			sleep = min(2*sleep, landSleepMax)
		}
	}
}

// processGone reports whether no process has id pid any more.
func processGone(pid int) bool {
	return pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// afterByRef runs on the read loop after a by-reference frame: when it
// carried a large tensor, the peer is granted memory for the next one, of
// that tensor's size class (a grant of another size is revoked first).
func (c *conn) afterByRef(f *wire.Frame) {
	size := uint64(0)
	for _, t := range f.Tensors {
		size = max(size, uint64(len(t.Header.Raw)))
	}
	if size < pushFrom {
		return
	}
	class := recvbuf.Class(size)
	ls := &c.land
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.want = class
	switch {
	case ls.closed || ls.revoking:
	case ls.out == nil:
		c.grantLocked(class)
	case uint64(len(ls.out.mem)) != class:
		ls.revoking = true
		c.post(control(wire.KindRevoke, ls.out.token))
	}
}

// grantLocked grants the peer a receive buffer of class bytes; the caller
// holds c.land.mu.
func (c *conn) grantLocked(class uint64) {
	ls := &c.land
	ls.tokens++
	mem, blk := recvbuf.Landing(class)
	l := &landing{token: ls.tokens, mem: mem[:class], blk: blk}
	ls.out = l
	var payload [wire.GrantLen]byte
	binary.LittleEndian.PutUint64(payload[0:], uint64(uintptr(unsafe.Pointer(&mem[0]))))
	binary.LittleEndian.PutUint64(payload[8:], uint64(uintptr(unsafe.Pointer(&l.word))))
	head, _, _ := wire.AppendHead(make([]byte, 0, wire.HeaderLen+32), &wire.Frame{Kind: wire.KindGrant, ID: l.token, Aux: class, Payload: payload[:]})
	c.post(head)
}

// onRevoked takes back the grant the peer has let go, and grants one of
// the size wanted now.
func (c *conn) onRevoked(token uint64) {
	ls := &c.land
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.revoking = false
	if l := ls.out; l != nil && l.token == token {
		ls.out = nil
		recvbuf.Release(l.blk)
	}
	if !ls.closed && ls.out == nil && ls.want >= pushFrom {
		c.grantLocked(ls.want)
	}
}

// closeLandings ends the receiving side: memory still granted, or being
// received into, is quarantined until the peer is known to be done with it.
func (c *conn) closeLandings() {
	ls := &c.land
	ls.mu.Lock()
	ls.closed = true
	held := []*landing{ls.out, ls.using}
	ls.out, ls.using = nil, nil
	ls.mu.Unlock()
	pid := c.peerPID
	for _, l := range held {
		if l == nil {
			continue
		}
		recvbuf.Quarantine(l.blk, l, func() bool { return l.settled() || processGone(pid) })
	}
}

// onGrant keeps the memory the peer granted for the next large tensor.
func (c *conn) onGrant(f *wire.Frame) {
	g := &peerGrant{token: f.ID, size: f.Aux,
		addr: binary.LittleEndian.Uint64(f.Payload[0:]), word: binary.LittleEndian.Uint64(f.Payload[8:])}
	if !c.pushOK || g.token == 0 || g.size < pushFrom || g.size > uint64(c.a.opts.maxMessage) {
		c.close(wire.Malformed("worker %s sent a grant it may not (token %d, %d bytes)", c.peer, g.token, g.size))
		return
	}
	gs := &c.grant
	gs.mu.Lock()
	if gs.closed {
		gs.mu.Unlock()
		if err := c.setWord(g, pushRevoked); err != nil {
			c.close(err)
		}
		return
	}
	if gs.g != nil {
		gs.mu.Unlock()
		c.close(wire.Malformed("worker %s granted memory with grant %d outstanding", c.peer, gs.g.token))
		return
	}
	gs.g = g
	gs.mu.Unlock()
}

// onRevoke lets the grant under token go, if it is not used yet, and says
// so.
func (c *conn) onRevoke(token uint64) {
	gs := &c.grant
	gs.mu.Lock()
	if gs.g != nil && gs.g.token == token {
		gs.g = nil
	}
	gs.mu.Unlock()
	c.post(control(wire.KindRevoked, token))
}

// takeGrant takes the peer's grant for the largest of ts when it fits it,
// returning the grant and what the frame says of the push; nil when the
// frame is not pushed.
func (c *conn) takeGrant(ts []*tensor.Dense) (*peerGrant, wire.Push) {
	if !c.pushOK {
		return nil, wire.Push{}
	}
	index, size := 0, uint64(0)
	for i, t := range ts {
		if n := uint64(len(t.Header.Raw)); n > size {
			index, size = i, n
		}
	}
	if size < pushFrom {
		return nil, wire.Push{}
	}
	gs := &c.grant
	gs.mu.Lock()
	g := gs.g
	if g == nil || gs.closed || size > g.size || 4*size <= 3*g.size {
		gs.mu.Unlock()
		return nil, wire.Push{}
	}
	gs.g = nil
	gs.mu.Unlock()
	return g, wire.Push{Token: g.token, Index: uint64(index)}
}

// pushTail writes raw into the peer's grant from the end down, piece by
// piece, until it meets the part the receiver copies, then the completion
// word, with the status failed when a write failed (the receiver then
// copies the rest itself). Call it once the frame naming the push is
// written, and keep raw as it is until the receiver has acknowledged the
// frame.
func (c *conn) pushTail(g *peerGrant, raw []byte) {
	status := uint64(pushDone)
	if err := c.pushPieces(g, raw); err != nil {
		c.a.opts.logger.Warn("rpc: could not push a tensor; the worker copies it", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
		status = pushFailed
	}
	if err := c.setWord(g, status); err != nil {
		c.close(err)
	}
	c.a.m.pushed.Add(1)
}

// pushPieces writes raw's pieces from the last down while the receiver's
// front word is below them, and the tail word after each.
func (c *conn) pushPieces(g *peerGrant, raw []byte) error {
	n := uint64(len(raw))
	var word [8]byte
	for written := uint64(0); written < n; {
		hi := n - written
		if err := samehost.ReadAlone(c.peerPID, word[:], g.word+frontOffset); err != nil {
			return fmt.Errorf("reading the front word of worker %s (pid %d): %w", c.peer, c.peerPID, err)
		}
		if hi <= binary.LittleEndian.Uint64(word[:]) {
			return nil // the receiver has the rest
		}
		lo := (hi - 1) / pushPiece * pushPiece
		if err := samehost.Write(c.peerPID, g.addr+lo, raw[lo:hi]); err != nil {
			return err
		}
		written = n - lo
		binary.LittleEndian.PutUint64(word[:], written)
		if err := samehost.Write(c.peerPID, g.word+tailOffset, word[:]); err != nil {
			return fmt.Errorf("writing the tail word of worker %s (pid %d): %w", c.peer, c.peerPID, err)
		}
	}
	return nil
}

// pushAbort marks a grant whose frame did not go out whole; a connection
// whose peer cannot be told is closed.
func (c *conn) pushAbort(g *peerGrant) {
	if err := c.setWord(g, pushAborted); err != nil {
		c.close(err)
	}
}

// setWord ends the peer's grant g with status: the status word when it is
// not pushDone, then the completion word. It reports why the peer could not
// be told; the caller closes the connection, unless it is closing it
// already (close must not be entered again from inside itself).
func (c *conn) setWord(g *peerGrant, status uint64) error {
	var b [8]byte
	if status != pushDone {
		binary.LittleEndian.PutUint64(b[:], status)
		if err := samehost.Write(c.peerPID, g.word+statusOffset, b[:]); err != nil {
			return fmt.Errorf("writing a status word into worker %s (pid %d): %w", c.peer, c.peerPID, err)
		}
	}
	binary.LittleEndian.PutUint64(b[:], g.token)
	if err := samehost.Write(c.peerPID, g.word, b[:]); err != nil {
		return fmt.Errorf("writing a completion word into worker %s (pid %d): %w", c.peer, c.peerPID, err)
	}
	return nil
}

// closeGrants ends the sending side: the grant not used is let go, and the
// peer told so.
func (c *conn) closeGrants() {
	gs := &c.grant
	gs.mu.Lock()
	gs.closed = true
	g := gs.g
	gs.g = nil
	gs.mu.Unlock()
	if g == nil {
		return
	}
	// The connection is closing already, from close itself: a peer that
	// cannot be told (its process gone) needs telling no more, and its
	// memory is its own to let go.
	if err := c.setWord(g, pushRevoked); err != nil {
		c.a.opts.logger.Debug("rpc: could not revoke a grant on close", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
	}
}
