package rpc

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"unsafe"
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
// Whether it works is tested once per connection at the handshake: each side
// publishes its pid, its boot id and the address of 16 random bytes, and the
// other side tries to read them (this fails across machines, across pid
// namespaces, and where ptrace rules or a seccomp filter forbid it; the
// connection then sends everything inline). WithSameHostCopy(false) turns it
// off.

// cmaThreshold is the tensor bytes from which a frame is sent by reference.
const cmaThreshold = 256 << 10

const cmaHelloLen = 1 + 4 + 16 + 8 + 16

// cmaHello is one side's offer of same-host copies.
type cmaHello struct {
	enabled bool
	pid     int
	boot    [16]byte
	addr    uint64
	probe   [16]byte
}

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

// newCMAHello makes this side's offer; the probe bytes must stay alive until
// the peer has read them.
func (a *Agent) newCMAHello() (cmaHello, *[16]byte) {
	probe := new([16]byte)
	if !a.opts.sameHostCopy || !cmaSupported || bootID == ([16]byte{}) {
		return cmaHello{}, probe
	}
	rand.Read(probe[:])
	return cmaHello{enabled: true, pid: os.Getpid(), boot: bootID, addr: uint64(uintptr(unsafe.Pointer(&probe[0]))), probe: *probe}, probe
}

func (h cmaHello) append(b []byte) []byte {
	en := byte(0)
	if h.enabled {
		en = 1
	}
	b = append(b, en)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.pid))
	b = append(b, h.boot[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.addr)
	return append(b, h.probe[:]...)
}

func readCMAHello(r io.Reader) (cmaHello, error) {
	var b [cmaHelloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return cmaHello{}, err
	}
	h := cmaHello{enabled: b[0] == 1, pid: int(binary.LittleEndian.Uint32(b[1:5]))}
	copy(h.boot[:], b[5:21])
	h.addr = binary.LittleEndian.Uint64(b[21:29])
	copy(h.probe[:], b[29:45])
	return h, nil
}

// canRead reports whether this side can copy out of the peer's memory.
func (mine cmaHello) canRead(peer cmaHello) bool {
	if !mine.enabled || !peer.enabled || mine.boot != peer.boot || peer.pid <= 0 {
		return false
	}
	var got [16]byte
	if err := cmaRead(peer.pid, got[:], peer.addr); err != nil {
		return false
	}
	return bytes.Equal(got[:], peer.probe[:])
}

// fetcher returns the function that copies by-reference tensors from the
// peer, or nil when this connection receives everything inline.
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
