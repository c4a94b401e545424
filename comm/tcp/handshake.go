package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/tokenauth"
)

// The handshake (version 4). Both ranks prove that they hold the shared
// token by the challenge-response of internal/tokenauth (protocol name
// "tandem-tcp"), with a fresh nonce on each side; the token never crosses
// the wire. Four fixed-size records go back and forth:
//
//	magic "TNDM" | version | kind | status | 0 | rank u32 | size u32 | peer u32 | run [16] | data [32]
//
//	dialer   -> acceptor: hello     (kind 1) data: the dialer's nonce
//	acceptor -> dialer:   challenge (kind 3) data: the acceptor's nonce
//	dialer   -> acceptor: proof     (kind 4) data: the dialer's MAC
//	acceptor -> dialer:   reply     (kind 2) status; data: the acceptor's MAC when the status is OK
//
// In a hello and a proof, rank is the dialer's and peer the rank it means to
// reach; in a challenge and a reply, rank is the acceptor's and peer echoes
// the dialer's. run is the run's nonce, which rank 0 publishes in the store,
// so that a stale rank of an earlier run is told apart. The dialer's MAC
// binds the bodies (every byte before data) of the hello and the challenge;
// the acceptor's binds those and the reply's body, status included. The
// acceptor looks at nothing in the hello before the dialer's MAC verifies,
// and proves itself only to a dialer that has proved itself.
//
// Version 3 sent one hello and one reply, each with an HMAC keyed by the
// token over its body and the run nonce, and no fresh nonce: a recorded
// handshake of a run could be replayed within it. A rank answers a hello of
// another version with a reply of its own version (status statusVersion),
// and a dialer that reads a record of another version gives up at once
// with a message naming both versions.
const (
	helloSize     = bodySize + tokenauth.NonceSize
	bodySize      = 20 + runNonceSize
	runNonceSize  = 16
	protoVersion  = 4 // 4: fresh nonces on both sides (internal/tokenauth); 3: the single-copy probe takes the peer's pid from the kernel (singlecopy.go); heartbeat frames (liveness.go)
	kindHello     = 1
	kindReply     = 2
	kindChallenge = 3
	kindProof     = 4

	// authProtocol names the mesh's key derivation in internal/tokenauth.
	authProtocol = "tandem-tcp"
)

// nonceSize is the size of the run nonce.
const nonceSize = runNonceSize

var magic = [4]byte{'T', 'N', 'D', 'M'}

// Reply statuses.
const (
	statusOK = iota
	statusUnauthorized
	statusSizeMismatch
	statusOtherRun
	statusWrongRank
	statusDuplicate
	statusVersion
)

// errVersion marks a record of another protocol version.
var errVersion = errors.New("another protocol version")

// hello is one record of the handshake, whatever its kind.
type hello struct {
	kind, status     byte
	rank, size, peer uint32
	nonce            [runNonceSize]byte // the run's
	data             [tokenauth.NonceSize]byte
}

// body returns the record's bytes before data: what the MACs bind.
func (h *hello) body() []byte {
	var b [bodySize]byte
	h.encodeBody(b[:])
	return b[:]
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
	copy(b[20:bodySize], h.nonce[:])
}

// proveDialer returns the dialer's MAC over its hello and the acceptor's
// challenge.
func proveDialer(key tokenauth.Key, h, ch *hello) tokenauth.MAC {
	return key.Prove(tokenauth.Dialer, h.data, ch.data, h.body(), ch.body())
}

// proveAcceptor returns the acceptor's MAC over the hello, its challenge
// and its reply.
func proveAcceptor(key tokenauth.Key, h, ch, r *hello) tokenauth.MAC {
	return key.Prove(tokenauth.Acceptor, h.data, ch.data, h.body(), ch.body(), r.body())
}

func writeHello(w io.Writer, h *hello) error {
	var b [helloSize]byte
	h.encodeBody(b[:])
	copy(b[bodySize:], h.data[:])
	_, err := w.Write(b[:])
	return err
}

// readHello reads one record of the given kind into a fixed-size array. A
// record of another protocol version yields an error wrapping errVersion
// and transport.ErrMismatch, whatever its kind.
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
		return nil, fmt.Errorf("tcp: handshake: the peer speaks process-group protocol version %d, this rank version %d; "+
			"run the same Tandem version on every rank: %w: %w", b[4], protoVersion, errVersion, transport.ErrMismatch)
	}
	if b[5] != kind {
		return nil, fmt.Errorf("tcp: handshake: unexpected record kind %d, want %d: %w", b[5], kind, transport.ErrMismatch)
	}
	h := &hello{kind: b[5], status: b[6]}
	h.rank = binary.LittleEndian.Uint32(b[8:])
	h.size = binary.LittleEndian.Uint32(b[12:])
	h.peer = binary.LittleEndian.Uint32(b[16:])
	copy(h.nonce[:], b[20:bodySize])
	copy(h.data[:], b[bodySize:])
	return h, nil
}
