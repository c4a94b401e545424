// Package peercred finds out from the kernel which local process is on the
// other end of a TCP connection, for the single-copy transfers of comm/tcp
// and rpc.
//
// A single copy reads the peer's memory with process_vm_readv(2), which
// takes a process id. A process id that the peer states itself proves
// nothing: a peer holding the token could name any process it likes (one of
// another user, say root's, if this process runs as root) together with a
// few bytes it knows are in that process's memory, and have this process
// copy that memory out for it. So the process id used for reading is only
// ever the one the kernel reports, and only for a process of this user.
//
// TCP carries no credentials, so the proof goes through a Unix domain
// socket, whose SO_PEERCRED the kernel fills in at connect time:
//
//   - The side that wants to read the peer's memory makes a Challenge: a
//     listener on a random name in the abstract Unix namespace
//     ("@tandem-<32 hex digits>") and a random 32-byte nonce. It sends the
//     Offer (the name's random part and the nonce) to the peer over the TCP
//     connection, which has already been authenticated.
//   - The peer runs Prove: it dials that name and writes the nonce and the
//     TCP connection's two endpoints as it sees them, then hangs up.
//   - The challenger's Accept takes connections on its listener until one
//     carries the right nonce (compared in constant time); connections
//     that carry anything else are dropped and it goes on waiting, until
//     the context ends. A proof with the right nonce must also carry the
//     endpoints of the challenger's own TCP connection, seen from the other
//     end; if it names other endpoints (a proxy or NAT between the two, or
//     a relayed offer) the challenge fails at once. Of the one that
//     matches it asks the kernel the peer's process and user ids
//     (SO_PEERCRED). A user id other than this
//     process's effective one, or a process id of 0 (the peer lives in a
//     PID namespace this process cannot see into), fails.
//
// The endpoints tie the proof to the TCP connection it is made for. Without
// them a peer could hand the offer on to a third process that is itself
// proving something, over a TCP connection of its own, to the peer (another
// worker of the same user, say): that process would prove its identity to
// this one, and this process would read the third process's memory on the
// peer's behalf. The third process writes the endpoints of its own
// connection, which differ; the two ends of one TCP connection in one
// network namespace are unique, and abstract Unix names are only reachable
// within one network namespace.
//
// Both sides of a connection may prove to each other before either
// accepts: a proof is a connect and a small write, which the kernel queues
// in the listener's backlog, so neither side waits for the other.
//
// The nonce travels like the token, in the clear unless the connection
// runs over TLS; a process that can read loopback traffic can read the
// token too. The abstract names are visible in /proc/net/unix, so any
// local process can connect to a listener; without the nonce its
// connection is dropped, and at worst it delays the proof until the
// context ends, after which the transfer goes through the socket.
//
// One race remains. The kernel reports the process id that connected; the
// reads come later, and were that process to exit and its id to be given
// to a new process, the reads would go to the new one. Only a process of
// this user can pass the check, though, so the attacker would already have
// this user's rights, and process_vm_readv reads only where this process
// may ptrace: a same-user attacker can read those processes itself. The
// race gains it nothing, so it is left open rather than held shut with a
// pidfd checked after every read.
//
// On systems other than Linux, NewChallenge and Prove return
// ErrUnsupported and transfers go through the socket.
package peercred

import (
	"errors"
	"net"
	"net/netip"
)

const (
	// NonceSize is the size of a challenge's nonce.
	NonceSize = 32
	// nameSize is the random part of a challenge's listener name.
	nameSize = 16
	// OfferSize is the size of an Offer on the wire: the name's random
	// part and the nonce.
	OfferSize = nameSize + NonceSize
	// proofSize is what a prover writes: the nonce, then its local and its
	// remote TCP endpoint (16-byte address and a 2-byte port each).
	proofSize = NonceSize + 2*endpointSize
	// endpointSize is one TCP endpoint in a proof.
	endpointSize = 18
	// namePrefix starts every challenge's name; a prover dials nothing
	// else, so a peer cannot point it at an unrelated abstract socket.
	namePrefix = "@tandem-"
	// maxReaders bounds the connections a challenge reads at once.
	maxReaders = 16
)

// ErrUnsupported is returned where the kernel cannot say who the peer is.
var ErrUnsupported = errors.New("peercred: peer credentials are not supported on this system")

// Cred is the kernel's account of the process that proved itself.
type Cred struct {
	PID int // process id, in this process's PID namespace
	UID int // user id, in this process's user namespace
}

// endpoints returns a TCP connection's local and remote endpoint as the
// proof carries them: IPv4-mapped addresses unmapped and zones dropped, so
// that both ends write the same bytes for the same endpoint.
func endpoints(conn net.Conn) (local, remote [endpointSize]byte, ok bool) {
	l, ok1 := addrPort(conn.LocalAddr())
	r, ok2 := addrPort(conn.RemoteAddr())
	if !ok1 || !ok2 {
		return local, remote, false
	}
	return encodeEndpoint(l), encodeEndpoint(r), true
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok || ta == nil {
		return netip.AddrPort{}, false
	}
	ap := ta.AddrPort()
	if !ap.IsValid() {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()), true
}

func encodeEndpoint(ap netip.AddrPort) (b [endpointSize]byte) {
	a16 := ap.Addr().As16()
	copy(b[:16], a16[:])
	b[16], b[17] = byte(ap.Port()>>8), byte(ap.Port())
	return b
}
