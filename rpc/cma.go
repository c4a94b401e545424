package rpc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/internal/peercred"
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
// turns it off.

// cmaThreshold is the tensor bytes from which a frame is sent by reference.
const cmaThreshold = 256 << 10

// cmaHelloLen is the size of a same-host offer on the wire:
//
//	flags (1) | boot id (16) | probe address (u64) | probe bytes (16) | challenge (peercred.OfferSize)
const cmaHelloLen = 1 + 16 + 8 + 16 + peercred.OfferSize

// Offer flags.
const (
	cmaEnabled = 1 // the sender offers same-host copies; the rest is valid
	cmaProved  = 2 // (the acceptor's reply only) the acceptor has proved itself to the dialler's challenge
)

// Bits of the bytes the two sides exchange after the acceptor's reply.
const (
	cmaSentProof = 1 // the sender has proved itself to the other's challenge
	cmaReadsYou  = 2 // the sender reads the other's tensors from its memory
)

// cmaProofWait bounds the wait for a proof the peer says it has made (the
// kernel has queued it by then, so the wait is normally none).
const cmaProofWait = 2 * time.Second

// cmaHello is one side's offer of same-host copies.
type cmaHello struct {
	flags     byte
	boot      [16]byte
	addr      uint64
	probe     [16]byte
	challenge [peercred.OfferSize]byte
}

func (h cmaHello) enabled() bool { return h.flags&cmaEnabled != 0 }

// bootID identifies this kernel boot (zero when unknown).
var bootID = func() (id [16]byte) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	h, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(h) != 16 {
		return id
	}
	copy(id[:], h)
	return id
}()

// cmaSide is this side of one connection's same-host negotiation.
type cmaSide struct {
	hello cmaHello
	probe *[16]byte // read by the peer: must stay alive until the handshake ends
	ch    *peercred.Challenge
}

// newCMASide makes this side's offer. Call close when the handshake ends.
func (a *Agent) newCMASide() *cmaSide {
	s := &cmaSide{probe: new([16]byte)}
	if !a.opts.sameHostCopy || !cmaSupported || bootID == ([16]byte{}) {
		return s
	}
	if _, err := rand.Read(s.probe[:]); err != nil {
		return s
	}
	ch, err := peercred.NewChallenge()
	if err != nil {
		return s
	}
	s.ch = ch
	s.hello = cmaHello{flags: cmaEnabled, boot: bootID, addr: uint64(uintptr(unsafe.Pointer(&s.probe[0]))), probe: *s.probe}
	copy(s.hello.challenge[:], ch.Offer())
	return s
}

// close ends the negotiation: the peer has read the probe, if it could.
func (s *cmaSide) close() {
	if s.ch != nil {
		s.ch.Close()
	}
	runtime.KeepAlive(s.probe)
}

// compatible reports whether both sides offer same-host copies on the same
// kernel.
func (s *cmaSide) compatible(peer cmaHello) bool {
	return s.hello.enabled() && peer.enabled() && s.hello.boot == peer.boot
}

// prove answers the peer's challenge, so that it may read this process's
// memory; it reports whether the proof went out.
func (s *cmaSide) prove(ctx context.Context, peer cmaHello, nc net.Conn) bool {
	if !s.compatible(peer) {
		return false
	}
	return peercred.Prove(ctx, peer.challenge[:], nc) == nil
}

// verify takes the peer's proof and reads its probe bytes at the process
// id the kernel reported; it returns that id when this side can read the
// peer's memory, else 0.
func (s *cmaSide) verify(ctx context.Context, peer cmaHello, nc net.Conn) int {
	if !s.compatible(peer) {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, cmaProofWait)
	defer cancel()
	cred, err := s.ch.Accept(ctx, nc)
	if err != nil {
		return 0
	}
	var got [16]byte
	if err := cmaRead(cred.PID, got[:], peer.addr); err != nil || !bytes.Equal(got[:], peer.probe[:]) {
		return 0
	}
	return cred.PID
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
		if err := cmaRead(pid, dst, addr); err != nil {
			return fmt.Errorf("copying %d bytes from worker %s (pid %d): %w", len(dst), c.peer, pid, err)
		}
		return nil
	}
}
