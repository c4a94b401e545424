package rpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/tandemml/tandem/internal/samehost"
)

// Same-host copies. When two workers run on the same machine (the same
// kernel boot), a large tensor need not cross the TCP socket: the sender
// puts the tensor's address in the frame and the receiver copies the bytes
// straight out of the sender's memory with process_vm_readv (Linux's cross
// memory attach), one copy instead of the socket's two. The receiver then
// acknowledges the frame, and the sender waits for that acknowledgement
// before its call (or reply) goes on, so that, as over TCP, a tensor may be
// changed as soon as the call that sent it has been sent.
//
// Whether it works is settled once per connection at the handshake, and
// which process is read is the kernel's word, never the peer's: a peer that
// could name a process would have this worker copy any memory it may read
// (another user's process, say, if this worker runs as root) into a
// reply. Each side publishes its boot id, the address of 16 random bytes
// and a challenge (internal/peercred: an abstract Unix socket's name and a
// nonce). Each proves itself by connecting to the other's socket with the
// nonce, and learns from the kernel (SO_PEERCRED) which process connected
// to its own: only a process of this worker's user, at the other end of
// this TCP connection, passes. Then it reads the peer's 16 bytes at that
// process id, which shows that the kernel lets it (ptrace rules, seccomp).
// Where any step fails (another machine, another user or PID namespace,
// Yama) the connection sends everything inline. WithSameHostCopy(false)
// turns it off. The steps both ends share with comm/tcp are in
// internal/samehost; the layout of the offer below is this protocol's own.

// cmaThreshold is the tensor bytes from which a frame is sent by reference.
const cmaThreshold = 256 << 10

// cmaHelloLen is the size of a same-host offer on the wire:
//
//	flags (1) | boot id (16) | probe address (u64) | probe bytes (16) | challenge (samehost.ChallengeSize)
const cmaHelloLen = 1 + 16 + 8 + samehost.TokenSize + samehost.ChallengeSize

// Offer flags.
const (
	cmaEnabled = 1 // the sender offers same-host copies; the rest is valid
	cmaProved  = 2 // (the acceptor's reply only) the acceptor has proved itself to the dialler's challenge
)

// Bits of the bytes the two sides exchange after the acceptor's reply.
const (
	cmaSentProof = 1 // the sender has proved itself to the other's challenge
	cmaReadsYou  = 2 // the sender reads the other's tensors from its memory
	cmaPushes    = 4 // the sender pushes tensors and grants memory (push.go, WithPush)
)

// cmaHello is one side's offer of same-host copies.
type cmaHello struct {
	flags     byte
	boot      [16]byte
	addr      uint64
	probe     [samehost.TokenSize]byte
	challenge [samehost.ChallengeSize]byte
}

func (h cmaHello) enabled() bool { return h.flags&cmaEnabled != 0 }

// cmaSide is this side of one connection's same-host negotiation.
type cmaSide struct {
	hello cmaHello
	offer *samehost.Offer
}

// newCMASide makes this side's offer. Call close when the handshake ends.
func (a *Agent) newCMASide() *cmaSide {
	boot := samehost.BootID()
	s := &cmaSide{offer: samehost.NewOffer(a.opts.sameHostCopy && boot != [16]byte{})}
	if s.offer.Enabled() {
		s.hello = cmaHello{flags: cmaEnabled, boot: boot, addr: s.offer.Addr(), probe: s.offer.Token()}
		copy(s.hello.challenge[:], s.offer.Challenge())
	}
	return s
}

// close ends the negotiation: the peer has read the probe, if it could.
func (s *cmaSide) close() { s.offer.Close() }

// compatible reports whether both sides offer same-host copies on the same
// kernel.
func (s *cmaSide) compatible(peer cmaHello) bool {
	return s.hello.enabled() && peer.enabled() && s.hello.boot == peer.boot
}

// prove answers the peer's challenge, so that it may read this process's
// memory; it reports whether the proof went out.
func (s *cmaSide) prove(ctx context.Context, peer cmaHello, nc net.Conn) bool {
	return s.compatible(peer) && s.offer.Prove(ctx, peer.challenge[:], nc)
}

// verify takes the peer's proof and reads its probe bytes at the process
// id the kernel reported; it returns that id when this side can read the
// peer's memory, else 0.
func (s *cmaSide) verify(ctx context.Context, peer cmaHello, nc net.Conn) int {
	if !s.compatible(peer) {
		return 0
	}
	return s.offer.Verify(ctx, nc, peer.addr, peer.probe)
}

func (h cmaHello) append(b []byte) []byte {
	b = append(b, h.flags)
	b = append(b, h.boot[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.addr)
	b = append(b, h.probe[:]...)
	return append(b, h.challenge[:]...)
}

func readCMAHello(r io.Reader) (cmaHello, error) {
	var b [cmaHelloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return cmaHello{}, err
	}
	h := cmaHello{flags: b[0]}
	copy(h.boot[:], b[1:17])
	h.addr = binary.LittleEndian.Uint64(b[17:25])
	copy(h.probe[:], b[25:41])
	copy(h.challenge[:], b[41:])
	return h, nil
}

// fetcher returns the function that copies by-reference tensors from the
// peer, or nil when this connection receives everything inline. The
// process id is the one the kernel reported at the handshake.
func (c *conn) fetcher() func(dst []byte, addr uint64) error {
	if !c.recvByRef {
		return nil
	}
	pid := c.peerPID
	return func(dst []byte, addr uint64) error {
		if err := samehost.Read(pid, dst, addr); err != nil {
			return fmt.Errorf("copying %d bytes from worker %s (pid %d): %w", len(dst), c.peer, pid, err)
		}
		return nil
	}
}
