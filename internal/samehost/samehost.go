// Package samehost copies memory between two processes of one machine, for
// the same-host copies of comm/tcp and rpc: one process_vm_readv(2) (and
// process_vm_writev(2), for rpc's pushed tensors), one
// system call table and one probe that settles, per connection, whether the
// other end's memory may be read.
//
// Through a socket every byte is copied twice (into the kernel by the
// sender, out of it by the receiver). Between two processes of one machine
// the receiver can instead copy a large buffer straight out of the sender's
// memory (Read), once.
//
// Which process is read is the kernel's word, never the peer's: a peer that
// could name a process would have this one copy any memory it may read
// (another user's process, say, if this one runs as root) to the peer. So
// each side of a connection publishes an Offer: the address of 16 random
// bytes in its memory (the token) and a challenge (internal/peercred: an
// abstract Unix socket's name and a nonce). Each proves itself by
// connecting to the other's socket with the nonce (Offer.Prove), and learns
// from the kernel (SO_PEERCRED) which process connected to its own: only a
// process of this user, at the other end of this TCP connection, passes.
// Then it reads the peer's token at that process id (Offer.Verify), which
// shows that the kernel lets it (ptrace rules, seccomp, namespaces). Where
// any step fails the connection carries everything inline.
//
// How an offer is laid out on the wire is each protocol's own; this
// package holds the steps they share.
package samehost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/tandemml/tandem/internal/peercred"
)

// TokenSize is the size of an offer's token.
const TokenSize = 16

// ChallengeSize is the size of an offer's challenge on the wire.
const ChallengeSize = peercred.OfferSize

// ProofWait bounds Verify's wait for a proof the peer says it has made (the
// kernel has queued it by then, so the wait is normally none).
const ProofWait = 2 * time.Second

// Offer is this process's side of the probe on one connection: a token the
// peer reads from this process's memory, and, when same-host copies are on,
// a challenge the peer proves itself to. Close it when the probe is over.
type Offer struct {
	token *[TokenSize]byte
	pin   runtime.Pinner
	ch    *peercred.Challenge
}

// NewOffer makes this side's offer. With on false, or where the kernel
// offers no process_vm_readv or no challenge socket, the offer is off
// (Enabled reports false): it still has a token, which costs nothing, but no
// challenge, so that no peer reads this process.
func NewOffer(on bool) *Offer {
	o := &Offer{token: new([TokenSize]byte)}
	o.pin.Pin(o.token) // the peer reads the token from this process's memory
	if _, err := rand.Read(o.token[:]); err != nil || !on || !Supported {
		return o
	}
	if ch, err := peercred.NewChallenge(); err == nil {
		o.ch = ch
	}
	return o
}

// Enabled reports whether this side offers same-host copies.
func (o *Offer) Enabled() bool { return o.ch != nil }

// Addr is the token's address in this process.
func (o *Offer) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(o.token))) }

// Token is the token's value, which the peer must read at Addr.
func (o *Offer) Token() [TokenSize]byte { return *o.token }

// Challenge is the challenge the peer proves itself to (ChallengeSize
// bytes), nil when the offer is off.
func (o *Offer) Challenge() []byte {
	if o.ch == nil {
		return nil
	}
	return o.ch.Offer()
}

// Prove answers the peer's challenge over the connection nc, so that the
// peer may read this process's memory; it reports whether the proof went
// out. It does nothing when this side's offer is off.
func (o *Offer) Prove(ctx context.Context, challenge []byte, nc net.Conn) bool {
	return o.ch != nil && peercred.Prove(ctx, challenge, nc) == nil
}

// Verify takes the peer's proof on nc, waiting at most ProofWait, and reads
// the peer's token (addr, token) at the process id the kernel reported. It
// returns that process id when this side can read the peer's memory, else
// 0. It is 0 at once when this side's offer is off.
func (o *Offer) Verify(ctx context.Context, nc net.Conn, addr uint64, token [TokenSize]byte) int {
	if o.ch == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, ProofWait)
	defer cancel()
	cred, err := o.ch.Accept(ctx, nc)
	if err != nil {
		return 0
	}
	var got [TokenSize]byte
	if err := Read(cred.PID, got[:], addr); err != nil || got != token {
		return 0
	}
	return cred.PID
}

// Close ends the probe: the peer has read the token, if it could.
func (o *Offer) Close() {
	if o.ch != nil {
		o.ch.Close()
	}
	o.pin.Unpin()
}

// BootID identifies this kernel boot (zero when unknown): two processes
// with the same boot id run on one machine.
var BootID = sync.OnceValue(func() (id [16]byte) {
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
})
