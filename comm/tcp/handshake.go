package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tandemml/tandem/comm/transport"
)

// The handshake: the dialer sends a hello, the acceptor answers with a reply.
// Both are fixed-size records:
//
//	magic "TNDM" | version | kind | status | 0 | rank u32 | size u32 | peer u32 | nonce [16] | mac [32]
//
// In a hello, rank is the dialer's, peer the rank it means to reach; in a
// reply, rank is the acceptor's and peer echoes the dialer's. The mac is an
// HMAC-SHA256 keyed by the shared token over every preceding byte (and, in a
// reply, over the hello's mac too), so both sides prove that they hold the
// token without sending it.
const (
	helloSize    = 4 + 4 + 12 + nonceSize + sha256.Size
	nonceSize    = 16
	protoVersion = 3 // 3: the single-copy probe takes the peer's pid from the kernel (singlecopy.go); heartbeat frames (liveness.go)
	kindHello    = 1
	kindReply    = 2
)

var magic = [4]byte{'T', 'N', 'D', 'M'}

// Reply statuses.
const (
	statusOK = iota
	statusUnauthorized
	statusSizeMismatch
	statusOtherRun
	statusWrongRank
	statusDuplicate
)

type hello struct {
	kind, status     byte
	rank, size, peer uint32
	nonce            [nonceSize]byte
	mac              [sha256.Size]byte
}

func (h *hello) encodeBody(b []byte) {
	copy(b[0:4], magic[:])
	b[4] = protoVersion
	b[5] = h.kind
	b[6] = h.status
	b[7] = 0
	binary.LittleEndian.PutUint32(b[8:], h.rank)
	binary.LittleEndian.PutUint32(b[12:], h.size)
	binary.LittleEndian.PutUint32(b[16:], h.peer)
	copy(b[20:20+nonceSize], h.nonce[:])
}

const macOffset = 20 + nonceSize

// sign computes h.mac with token; bind is the hello's mac when signing a reply.
func (h *hello) sign(token string, bind []byte) {
	var b [helloSize]byte
	h.encodeBody(b[:])
	h.mac = computeMAC(token, b[:macOffset], bind)
}

func (h *hello) verify(token string, bind []byte) bool {
	var b [helloSize]byte
	h.encodeBody(b[:])
	want := computeMAC(token, b[:macOffset], bind)
	return hmac.Equal(want[:], h.mac[:])
}

func computeMAC(token string, body, bind []byte) [sha256.Size]byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write(body)
	m.Write(bind)
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

func writeHello(w io.Writer, h *hello) error {
	var b [helloSize]byte
	h.encodeBody(b[:])
	copy(b[macOffset:], h.mac[:])
	_, err := w.Write(b[:])
	return err
}

func readHello(r io.Reader, kind byte) (*hello, error) {
	var b [helloSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, err
	}
	if [4]byte(b[0:4]) != magic {
		return nil, fmt.Errorf("tcp: handshake: the peer is not a Tandem TCP transport (bad magic %q): %w",
			b[0:4], transport.ErrMismatch)
	}
	if b[4] != protoVersion {
		return nil, fmt.Errorf("tcp: handshake: peer speaks protocol version %d, this rank %d: %w",
			b[4], protoVersion, transport.ErrMismatch)
	}
	if b[5] != kind {
		return nil, fmt.Errorf("tcp: handshake: unexpected record kind %d: %w", b[5], transport.ErrMismatch)
	}
	h := &hello{kind: b[5], status: b[6]}
	h.rank = binary.LittleEndian.Uint32(b[8:])
	h.size = binary.LittleEndian.Uint32(b[12:])
	h.peer = binary.LittleEndian.Uint32(b[16:])
	copy(h.nonce[:], b[20:20+nonceSize])
	copy(h.mac[:], b[macOffset:])
	return h, nil
}
