package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/samehost"
)

// Single-copy transfers between processes on one machine.
//
// Through a socket, every byte is copied twice (into the kernel by the
// sender, out of it by the receiver), plus the protocol's own work. Between
// two processes of one machine, a large message can instead stay where it is:
// the sender writes a reference frame (the message's length, its address in
// the sender's memory and an id), the receiver copies the bytes straight from
// the sender's memory into the receive buffer with process_vm_readv(2), and
// answers with an acknowledgement frame; Send returns when the
// acknowledgement arrives, so the buffer is never reused while it is read.
// That is one copy instead of two and no per-packet work, which roughly
// halves the processor time of moving bulk data between local ranks.
//
// Whether a pair of ranks can do this is probed when the connection is set
// up, and which process is read is the kernel's word, never the peer's: a
// peer that could name a process would have this rank copy any memory it
// may read (another user's process, say, if the rank runs as root) into a
// receive buffer. Each side publishes the address of a random token in its
// memory and a challenge (internal/peercred: an abstract Unix socket's
// name and a nonce); each proves itself by connecting to the other's
// socket with the nonce, and learns from the kernel (SO_PEERCRED) which
// process connected to its own: only a process of this rank's user, at the
// other end of this TCP connection, passes. It then reads the peer's token
// at that process id with process_vm_readv and says whether it saw it.
// This finds out, without guessing, whether the two processes share a
// machine, a network and a PID namespace and a user, and whether the kernel
// allows the read (ptrace access rules, seccomp). When it does not,
// messages travel through the socket as before. WithSameHostCopy(false)
// turns the mechanism off. The steps shared with rpc (process_vm_readv,
// the token and the challenge) are internal/samehost's; the record below
// is this protocol's own.
//
// The receiver copies in the goroutine of the Recv that takes the message
// (the reader goroutine only matches frames to receives and queues the
// others), so the reader is never busy copying. A reference whose Recv is
// not posted within refWait is copied into a buffer by a timer, so that the
// sender is never held up by a receive that comes much later.
//
// A send by reference ends with the acknowledgement or, when the link
// fails, only once the connection has ended (the reader has seen the
// peer close its side): until then the peer may still be copying, and the
// buffer must not be handed back. See copyRemote for the receiver's half.

// refMin is the smallest message sent by reference. Below it the extra
// acknowledgement costs more than the copy it saves, and a send stays
// independent of the receiver (comm exchanges small messages by sending
// first and receiving second).
const refMin = 256 << 10

// refWait is how long a reference waits for its Recv before a timer copies
// it into a buffer. Copying later costs an extra copy, not a stalled
// stream, so the wait can be generous: a rank descheduled for a few
// milliseconds (several ranks sharing a core) still takes its messages
// straight from the sender's memory.
const refWait = 5 * time.Millisecond

// refBodySize is the body of a reference frame: the address and the id.
const refBodySize = 16

// Acknowledgement statuses, in the length field of an acknowledgement frame.
const (
	ackCopied = 0 // the receiver has finished with the sender's buffer
	ackFailed = 1 // the receiver could not read the sender's memory
)

// remoteRef is a message that stays in the sending process's memory.
type remoteRef struct {
	addr uint64 // address of the payload in the sender
	id   uint64 // acknowledgement id; 0 means no reference
	n    uint64 // payload length
}

// sameHost is what the probe found out about one connection.
type sameHost struct {
	pid   int  // the peer's process id, as the kernel gave it, when this rank reads the peer's messages from its memory; 0 when not
	offer bool // the peer reads this rank's large messages from its memory
}

// probeSize is the size of a probe record:
//
//	magic "TNDS" | 1 when single copies are enabled | 3 zero bytes | token address u64 | token [16] | challenge [samehost.ChallengeSize]
//
// After the records each side sends one byte, 1 when it has proved itself
// to the other's challenge, and then its verdict, 1 when it has read the
// other's token at the process id the kernel gave. (Version 2 of the
// handshake carried the peer's own pid here instead of a challenge.)
const probeSize = 32 + samehost.ChallengeSize

var probeMagic = [4]byte{'T', 'N', 'D', 'S'}

// probeSameHost runs the probe on every connection at once.
func (b Backend) probeSameHost(ctx context.Context, rank int, conns []*net.TCPConn) ([]sameHost, error) {
	hosts := make([]sameHost, len(conns))
	errs := make(chan error, len(conns))
	running := 0
	for r, c := range conns {
		if c == nil {
			continue
		}
		running++
		go func() {
			var err error
			hosts[r], err = b.probe(ctx, c)
			if err != nil {
				err = fmt.Errorf("tcp: rank %d: probing whether rank %d shares this machine: %w", rank, r, err)
			}
			errs <- err
		}()
	}
	var first error
	for range running {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return hosts, nil
}

// probe runs both sides' probe on one connection: both write their
// record, prove themselves to the other's challenge, take the other's
// proof, try to read the other's token at the process the kernel named and
// report the outcome. Neither side waits for the other's proof before
// making its own, and each makes it before the byte that announces it.
func (b Backend) probe(ctx context.Context, c *net.TCPConn) (sameHost, error) {
	defer guard(ctx, c)()
	offer := samehost.NewOffer(b.sameHostCopy())
	defer offer.Close()
	var rec [probeSize]byte
	copy(rec[0:4], probeMagic[:])
	if offer.Enabled() {
		rec[4] = 1
		copy(rec[32:], offer.Challenge())
	}
	binary.LittleEndian.PutUint64(rec[8:], offer.Addr())
	token := offer.Token()
	copy(rec[16:32], token[:])
	if _, err := c.Write(rec[:]); err != nil {
		return sameHost{}, err
	}
	var peer [probeSize]byte
	if _, err := io.ReadFull(c, peer[:]); err != nil {
		return sameHost{}, err
	}
	if [4]byte(peer[0:4]) != probeMagic {
		return sameHost{}, fmt.Errorf("bad probe record %q: %w", peer[0:4], transport.ErrMismatch)
	}
	both := offer.Enabled() && peer[4] == 1
	var proved [1]byte
	if both && offer.Prove(ctx, peer[32:], c) {
		proved[0] = 1
	}
	if _, err := c.Write(proved[:]); err != nil {
		return sameHost{}, err
	}
	var theirProof [1]byte
	if _, err := io.ReadFull(c, theirProof[:]); err != nil {
		return sameHost{}, err
	}
	var verdict [1]byte
	var pid int
	if both && theirProof[0] == 1 {
		if pid = offer.Verify(ctx, c, binary.LittleEndian.Uint64(peer[8:]), [16]byte(peer[16:32])); pid != 0 {
			verdict[0] = 1
		}
	}
	if _, err := c.Write(verdict[:]); err != nil {
		return sameHost{}, err
	}
	var theirs [1]byte
	if _, err := io.ReadFull(c, theirs[:]); err != nil {
		return sameHost{}, err
	}
	return sameHost{pid: pid, offer: theirs[0] == 1 && proved[0] == 1}, nil
}

// sendRef sends buf by reference and waits until the peer has copied it.
func (p *peer) sendRef(ctx context.Context, tag transport.Tag, buf []byte) error {
	ack := p.t.getAck()
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		p.t.putAck(ack)
		return err
	}
	p.nextRef++
	id := p.nextRef
	p.acks[id] = ack
	p.mu.Unlock()
	if err := p.writeFrame(ctx, frameRef, tag, uint64(len(buf)), buf, id); err != nil {
		p.mu.Lock()
		_, pending := p.acks[id]
		delete(p.acks, id)
		p.mu.Unlock()
		if !pending {
			<-ack // the reader's exit has answered it meanwhile
		}
		p.t.putAck(ack)
		return err
	}
	var err error
	select {
	case err = <-ack:
	case <-ctx.Done():
		// The peer may be copying from buf right now, so buf cannot be
		// handed back yet: give the copy a moment, then cut the
		// connection (after which the peer discards what it read).
		timer := time.NewTimer(recvGrace)
		select {
		case err = <-ack:
			timer.Stop() // the message made it after all
		case <-timer.C:
			p.fail(p.lostErr("was cut off: a send timed out while the message waited to be copied"))
			p.cutConn()
			<-ack
			err = p.t.ctxErr(ctx, "send", p.rank, tag)
		}
	}
	// buf must stay alive (and, being a heap object, in place) until the
	// peer has read it: it escapes to the heap through writeFrame.
	runtime.KeepAlive(buf)
	p.t.putAck(ack)
	return err
}

// acknowledge answers the reference frame id. It runs in a receiving
// goroutine (never the reader's), since it writes to the connection.
func (p *peer) acknowledge(id uint64, status uint64) {
	// Errors mean the link is gone; the peer learns of it by itself.
	_ = p.writeFrame(context.Background(), frameAck, transport.Tag(id), status, nil, 0)
}

// acknowledged is the reader's handling of an acknowledgement frame.
func (p *peer) acknowledged(id, status uint64) {
	p.mu.Lock()
	ack, ok := p.acks[id]
	delete(p.acks, id)
	p.mu.Unlock()
	if !ok {
		return // the send gave up and failed the link meanwhile
	}
	if status == ackCopied {
		ack <- nil
		return
	}
	ack <- p.lostErr("could not read a message from this process's memory (single-copy transfer failed; see that rank's error)")
}

// fetch copies the message ref names into buf and acknowledges it.
func (p *peer) fetch(tag transport.Tag, ref remoteRef, buf []byte) error {
	if uint64(len(buf)) != ref.n {
		p.acknowledge(ref.id, ackCopied) // dropped, as a payload of the wrong size is
		return p.mismatchErr(tag, int(ref.n), len(buf))
	}
	if err := p.copyRemote(buf, ref); err != nil {
		p.acknowledge(ref.id, ackFailed)
		return err
	}
	p.acknowledge(ref.id, ackCopied)
	return nil
}

// copyRemote reads ref from the peer's memory; a failure fails the link.
//
// A copy that ends after the link failed is not trusted: once the link has
// failed here, this rank closes its side, the sender's reader then ends,
// and only then may the sender's Send return without an acknowledgement
// and its caller reuse the buffer. A copy finished while the link still
// stood was therefore made from a buffer that could not change.
func (p *peer) copyRemote(buf []byte, ref remoteRef) error {
	if err := samehost.Read(p.refPID, buf, ref.addr); err != nil {
		lost := p.lostErr("could not be read from (single-copy transfer of %d bytes failed: %v)", len(buf), err)
		p.fail(lost)
		p.cutConn()
		return lost
	}
	return p.goneErr()
}

// deliverRef is the reader's handling of a reference frame of a message of
// n bytes under tag, whose body is in p.rref.
func (p *peer) deliverRef(tag transport.Tag, n uint64) error {
	ref := remoteRef{addr: binary.LittleEndian.Uint64(p.rref[0:]), id: binary.LittleEndian.Uint64(p.rref[8:]), n: n}
	if p.refPID == 0 || ref.id == 0 {
		return p.lostErr("sent a message by reference, which this rank never agreed to (protocol error)")
	}
	if n > uint64(p.t.maxMsg) {
		go p.acknowledge(ref.id, ackCopied)
		tooLarge := fmt.Errorf("tcp: rank %d: rank %d sent %d bytes under tag %#x, above this rank's message limit of %d bytes; give every rank the same MaxMessage: %w",
			p.t.rank, p.rank, n, uint64(tag), p.t.maxMsg, transport.ErrTooLarge)
		p.handOver(tag, &message{err: tooLarge})
		return nil
	}
	p.mu.Lock()
	if p.t.downErr() != nil {
		p.mu.Unlock()
		return nil // the peer learns that this rank is gone from the connection
	}
	if q := p.queues[tag]; q != nil && len(q.posted) > 0 {
		r := q.popPosted()
		p.tidy(tag, q)
		p.mu.Unlock()
		r.ref = ref
		r.done <- nil // the Recv copies and acknowledges
		return nil
	}
	// No Recv yet: queue the reference, without copying anything and
	// without holding up the frames behind it. Should no Recv take it
	// within refWait, it is copied into a buffer (resolveRef), so that the
	// sender is not held up until one does.
	m := &message{ref: ref}
	q := p.queue(tag)
	q.ready = append(q.ready, m)
	m.timer = time.AfterFunc(refWait, func() { p.resolveRef(tag, m) })
	p.mu.Unlock()
	return nil
}

// resolveRef copies a queued reference into a buffer of its own and
// acknowledges it, unless a Recv has taken it meanwhile.
func (p *peer) resolveRef(tag transport.Tag, m *message) {
	p.mu.Lock()
	q := p.queues[tag]
	if q == nil || !slices.Contains(q.ready, m) {
		p.mu.Unlock()
		return // a Recv took it
	}
	done := make(chan struct{})
	m.copying = done
	ref := m.ref
	p.mu.Unlock()
	b := p.t.msgs.get(int(ref.n))
	err := p.copyRemote(b.data, ref)
	p.mu.Lock()
	if err != nil {
		m.err = err
	} else {
		m.data = b.data
	}
	m.ref = remoteRef{}
	p.mu.Unlock()
	close(done)
	if err == nil {
		p.acknowledge(ref.id, ackCopied)
	}
}
