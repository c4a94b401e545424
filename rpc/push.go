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
// connection (a receive buffer of the size it received last, and a
// completion word), and the sender, once the frame that names the grant is
// written, writes the tensor's tail into that memory itself
// (process_vm_writev) while the receiver copies its head; then it stores
// the grant's token in the completion word, which the receiver waits for.
// The copy runs on two cores instead of one.
//
// Only the receiver's own memory is written, at addresses the receiver
// named for the purpose, and only by the process the kernel named at the
// handshake (the same proof as for reading). Memory granted to a peer is
// never handed to anything else until the peer is known to be done with
// it: the completion word shows the token (or a failure), the peer let the
// grant go (revoked, or its connection closed, which it marks in the word),
// or its process is gone. A grant outstanding when the connection fails
// otherwise is quarantined (recvbuf.Quarantine) until one of those holds.
//
// The receiver adapts the part the sender writes (its share, in 256ths):
// when the sender's part is already in when the receiver has copied its
// own, the sender takes more the next time, and less when the receiver had
// to wait, so that both finish together.

// pushFrom is the tensor size from which tensors are pushed.
const pushFrom = 1 << 20

// The sender's share of a pushed tensor, in 256ths: where it starts, its
// bounds, and the step by which it moves after each tensor.
const (
	shareStart = 128
	shareMin   = 16
	shareMax   = 240
	shareStep  = 4
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

// landing is memory this side granted the peer, and its completion and
// status words (granted as one address: the status is the word after).
type landing struct {
	word   atomic.Uint64
	status atomic.Uint64
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
	using    *landing // being received into (between Land and Landed)
	share    int      // the sender's share, in 256ths
	tokens   uint64
	want     uint64 // the size of the next grant: the last large tensor's class
	closed   bool
}

// peerGrant is memory the peer granted this side.
type peerGrant struct {
	token, addr, word, size uint64
	share                   uint64
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

// FetchHead implements wire.Landings: the receiver's part of a pushed
// tensor, copied on the read loop alone (the sender is the second core; a
// helper as well would contend with it).
func (cl *connLandings) FetchHead(dst []byte, addr uint64) error {
	c := (*conn)(cl)
	if err := samehost.ReadAlone(c.peerPID, dst, addr); err != nil {
		return fmt.Errorf("copying %d bytes from worker %s (pid %d): %w", len(dst), c.peer, c.peerPID, err)
	}
	return nil
}

// Landed implements wire.Landings: it waits for the peer's part of the
// grant being received into, polling its completion word, then sleeping
// between looks, until the word is set, this connection closes, the peer's
// process is gone, or the agent's timeout passes.
func (cl *connLandings) Landed(token uint64) (bool, error) {
	c := (*conn)(cl)
	ls := &c.land
	ls.mu.Lock()
	l := ls.using
	ls.mu.Unlock()
	if l == nil || l.token != token {
		return false, wire.Malformed("no grant %d being received into", token)
	}
	first := l.settled()
	if !first {
		if err := c.awaitWord(l); err != nil {
			return false, err
		}
	}
	status := l.status.Load()
	switch status {
	case pushDone, pushFailed:
	case pushAborted:
		return false, fmt.Errorf("%w: rpc: worker %s abandoned the frame it pushed under grant %d", ErrPeerLost, c.peer, token)
	default:
		return false, wire.Malformed("worker %s ended its push under grant %d with status %d", c.peer, token, status)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.using != l {
		// The connection closed meanwhile, and quarantined the memory.
		return false, fmt.Errorf("%w: rpc: connection to worker %s closed while it pushed a tensor", ErrPeerLost, c.peer)
	}
	ls.using = nil
	if first {
		ls.share = min(ls.share+shareStep, shareMax)
	} else {
		ls.share = max(ls.share-shareStep, shareMin)
	}
	return status == pushDone, nil
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
	if ls.share == 0 {
		ls.share = shareStart
	}
	ls.tokens++
	mem, blk := recvbuf.Landing(class)
	l := &landing{token: ls.tokens, mem: mem[:class], blk: blk}
	ls.out = l
	var payload [wire.GrantLen]byte
	binary.LittleEndian.PutUint64(payload[0:], uint64(uintptr(unsafe.Pointer(&mem[0]))))
	binary.LittleEndian.PutUint64(payload[8:], uint64(uintptr(unsafe.Pointer(&l.word))))
	head, _, _ := wire.AppendHead(make([]byte, 0, wire.HeaderLen+32), &wire.Frame{Kind: wire.KindGrant, Code: byte(ls.share), ID: l.token, Aux: class, Payload: payload[:]})
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
	g := &peerGrant{token: f.ID, size: f.Aux, share: uint64(f.Code),
		addr: binary.LittleEndian.Uint64(f.Payload[0:]), word: binary.LittleEndian.Uint64(f.Payload[8:])}
	if !c.pushOK || g.token == 0 || g.size < pushFrom || g.size > uint64(c.a.opts.maxMessage) || g.share == 0 {
		c.close(wire.Malformed("worker %s sent a grant it may not (token %d, %d bytes, share %d)", c.peer, g.token, g.size, g.share))
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
	cut := (size - size*g.share/256) &^ 4095
	return g, wire.Push{Token: g.token, Index: uint64(index), Cut: cut}
}

// pushTail writes the bytes of raw from p.Cut into the peer's grant, then
// the completion word, with the status failed when the write failed (the
// receiver then copies those bytes itself). Call it once the frame naming
// the push is written, and keep raw as it is until the receiver has
// acknowledged the frame.
func (c *conn) pushTail(g *peerGrant, raw []byte, p wire.Push) {
	status := uint64(pushDone)
	if err := samehost.Write(c.peerPID, g.addr+p.Cut, raw[p.Cut:]); err != nil {
		c.a.opts.logger.Warn("rpc: could not push a tensor; the worker copies it", "worker", c.a.self.Name, "peer", c.peer.String(), "err", err)
		status = pushFailed
	}
	if err := c.setWord(g, status); err != nil {
		c.close(err)
	}
	c.a.m.pushed.Add(1)
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
		if err := samehost.Write(c.peerPID, g.word+8, b[:]); err != nil {
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
