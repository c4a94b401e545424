// Package tokenauth is the one challenge-response by which Tandem's
// connections prove that both ends hold the job's shared token without
// sending it. The TCP store (comm/store), the process-group mesh (comm/tcp)
// and RPC (rpc) all use it; each carries its messages in its own framing.
//
// # The protocol
//
// A connection has a dialer and an acceptor. Each picks a fresh random
// nonce (NonceSize bytes from crypto/rand) for every connection and sends it
// in the clear:
//
//	dialer   -> acceptor: hello     (the dialer's nonce, and the protocol's own fields)
//	acceptor -> dialer:   challenge (the acceptor's nonce)
//	dialer   -> acceptor: proof     (the dialer's MAC)
//	acceptor -> dialer:   verdict   (the acceptor's MAC when it accepts)
//
// A MAC is HMAC-SHA256 under a key derived from the token and the protocol's
// name (Key), over a transcript that holds, each length-prefixed so that no
// two transcripts read alike: a version label, the role of the side that
// proves (dialer or acceptor), both nonces in a fixed order, and whatever
// bytes the caller binds (the hello's fields: the claimed rank or session,
// the protocol version; the acceptor's verdict). The token itself never
// leaves the process, and neither does the derived key.
//
// What this buys:
//
//   - Mutual: the acceptor accepts only a dialer whose MAC verifies, and the
//     dialer trusts only an acceptor whose MAC verifies.
//   - No replay: a recorded proof is bound to the nonces of its connection;
//     a new connection has a fresh nonce on the side that verifies, so the
//     recorded MAC no longer matches.
//   - No reflection: the prover's role is in the transcript, so a peer
//     cannot send an acceptor's MAC back to it (or a dialer's to a dialer)
//     as its own proof, even when it opens a second connection in the other
//     direction to obtain one.
//   - No cross-protocol use: the key is derived per protocol, so a MAC
//     obtained from the store proves nothing to RPC or the mesh.
//   - The acceptor proves itself last, only to a dialer that has proved
//     itself: a stranger who connects learns no MAC under the token.
//
// What it does not buy: the bytes after the handshake are neither encrypted
// nor authenticated (use RPC's TLS option, or a private network, against an
// attacker who can alter traffic), and a dialer that connects to an impostor
// hands it one MAC, from which a weak token can be guessed offline. Use a
// long random token (the RPC agent makes one when none is given).
//
// An empty token is a key like any other: two sides without a token prove
// nothing to each other but still agree. Whether a side without a token
// accepts a peer that has one is each protocol's decision (the store server
// without a token accepts any client, as it always has).
//
// Comparisons are constant-time (crypto/hmac.Equal); nothing here allocates
// in proportion to what a peer sends.
package tokenauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
)

// NonceSize is the size of a nonce in bytes.
const NonceSize = 32

// MACSize is the size of a proof in bytes.
const MACSize = sha256.Size

// label versions the derivation and the transcript; changing either means
// a new label.
const label = "tandem tokenauth v1"

// Nonce is one side's fresh random challenge for one connection.
type Nonce [NonceSize]byte

// MAC is one side's proof that it holds the token.
type MAC [MACSize]byte

// Role names the side of a connection that makes a proof.
type Role byte

// The two roles. A proof made in one role never verifies in the other.
const (
	Dialer   Role = 1
	Acceptor Role = 2
)

func (r Role) String() string {
	switch r {
	case Dialer:
		return "dialer"
	case Acceptor:
		return "acceptor"
	}
	return fmt.Sprintf("Role(%d)", byte(r))
}

// NewNonce returns a fresh nonce from crypto/rand.
func NewNonce() (Nonce, error) {
	var n Nonce
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("tokenauth: reading a nonce from the system's random source: %w", err)
	}
	return n, nil
}

// Key is a token's key for one protocol: HMAC-SHA256 keyed by the token over
// the version label and the protocol's name. The zero Key is not valid; make
// one with NewKey.
type Key struct {
	k     [sha256.Size]byte
	empty bool
	ok    bool
}

// NewKey derives the key of token for protocol (a fixed name such as
// "tandem-store"). An empty token gives a valid key that Empty reports.
func NewKey(token []byte, protocol string) Key {
	m := hmac.New(sha256.New, token)
	writeField(m, []byte(label+" key"))
	writeField(m, []byte(protocol))
	var k Key
	m.Sum(k.k[:0])
	k.empty = len(token) == 0
	k.ok = true
	return k
}

// Empty reports whether the key was derived from an empty token.
func (k Key) Empty() bool { return k.empty }

// Prove returns the MAC that the side in role makes on a connection whose
// dialer and acceptor chose the given nonces; bind holds the further bytes
// that both sides must have seen alike (each part is length-prefixed, so
// the split between parts counts).
func (k Key) Prove(role Role, dialer, acceptor Nonce, bind ...[]byte) MAC {
	if !k.ok {
		panic("tokenauth: Prove with a zero Key; make one with NewKey")
	}
	m := hmac.New(sha256.New, k.k[:])
	writeField(m, []byte(label+" proof"))
	writeField(m, []byte{byte(role)})
	writeField(m, dialer[:])
	writeField(m, acceptor[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(bind)))
	m.Write(n[:])
	for _, b := range bind {
		writeField(m, b)
	}
	var out MAC
	m.Sum(out[:0])
	return out
}

// Verify reports, in constant time, whether mac is the proof that the side
// in role holding this key would make with these nonces and bound bytes.
func (k Key) Verify(role Role, dialer, acceptor Nonce, mac MAC, bind ...[]byte) bool {
	want := k.Prove(role, dialer, acceptor, bind...)
	return hmac.Equal(want[:], mac[:])
}

func writeField(w io.Writer, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	w.Write(n[:])
	w.Write(b)
}
