//go:build linux

package peercred

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// Challenge is one request that the peer prove which process it is: a
// listener on a random abstract Unix name and a nonce. Make one with
// NewChallenge, send its Offer to the peer, call Accept once, and Close it.
type Challenge struct {
	ln    *net.UnixListener
	offer [OfferSize]byte
}

// NewChallenge opens a challenge's listener.
func NewChallenge() (*Challenge, error) {
	c := &Challenge{}
	if _, err := rand.Read(c.offer[:]); err != nil {
		return nil, fmt.Errorf("peercred: generating a challenge: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketName(c.offer[:nameSize]), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("peercred: listening on an abstract Unix socket: %w", err)
	}
	c.ln = ln
	return c, nil
}

// Offer returns what the peer needs to prove itself (OfferSize bytes): the
// name of the challenge's listener and its nonce.
func (c *Challenge) Offer() []byte { return append([]byte(nil), c.offer[:]...) }

// Close closes the challenge's listener; proofs not yet taken are dropped.
func (c *Challenge) Close() error { return c.ln.Close() }

// Accept waits until the process at the other end of conn (the TCP
// connection the offer went through) proves itself, or ctx ends, and
// returns what the kernel says of it. Connections with a wrong nonce are
// dropped and the wait goes on; the right nonce with the endpoints of
// another connection ends the wait with an error wrapping
// errs.Unauthorized. A proof from a process of another user, or
// from a PID namespace this process cannot see into (the kernel reports
// pid 0), ends the wait with
// an error wrapping errs.Unauthorized; the Cred returned with it is the
// kernel's account all the same. Accept is called at most once.
func (c *Challenge) Accept(ctx context.Context, conn net.Conn) (Cred, error) {
	local, remote, ok := endpoints(conn)
	if !ok {
		return Cred{}, fmt.Errorf("peercred: the connection to identify the peer of is not TCP (%v): %w", conn.RemoteAddr(), ErrUnsupported)
	}
	// The prover writes the nonce, its local and its remote endpoint: this
	// side's remote and local ones.
	var want [proofSize]byte
	copy(want[:NonceSize], c.offer[nameSize:])
	copy(want[NonceSize:], remote[:])
	copy(want[NonceSize+endpointSize:], local[:])

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wake := func() { c.ln.SetDeadline(time.Unix(1, 0)) }
	stop := context.AfterFunc(ctx, wake)
	defer stop()

	type result struct {
		cred Cred
		err  error
	}
	found := make(chan result, 1)
	slots := make(chan struct{}, maxReaders)
	for {
		uc, err := c.ln.AcceptUnix()
		if err != nil {
			select {
			case r := <-found:
				return r.cred, r.err
			default:
			}
			if ctx.Err() != nil {
				return Cred{}, fmt.Errorf("peercred: waiting for the peer to prove which process it is: %w: %w", errs.Timeout, context.Cause(ctx))
			}
			return Cred{}, fmt.Errorf("peercred: accepting the peer's proof: %w", err)
		}
		select {
		case slots <- struct{}{}:
		default:
			uc.Close() // too many connections sending nothing: not the peer's
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			defer uc.Close()
			stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
			defer stop()
			var got [proofSize]byte
			if _, err := io.ReadFull(uc, got[:]); err != nil {
				return
			}
			if subtle.ConstantTimeCompare(got[:NonceSize], want[:NonceSize]) != 1 {
				return // a wrong nonce: not the peer's proof
			}
			var cred Cred
			var err error
			if subtle.ConstantTimeCompare(got[NonceSize:], want[NonceSize:]) != 1 {
				// The nonce travelled only over this connection, but the
				// prover's connection has other endpoints: a proxy or NAT
				// stands between the two (or the offer was relayed). Either
				// way no process can be named: say so now, not at the
				// deadline.
				err = fmt.Errorf("peercred: the peer's proof names another connection (a proxy or NAT between the two, or a relayed offer); its memory is not read: %w", errs.Unauthorized)
			} else {
				cred, err = peerCred(uc)
			}
			select {
			case found <- result{cred, err}:
				wake()
			default:
			}
		}()
	}
}

// peerCred asks the kernel who connected uc and checks that it is a
// process of this user in this PID namespace.
func peerCred(uc *net.UnixConn) (Cred, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peercred: %w", err)
	}
	var u *syscall.Ucred
	var uerr error
	if err := rc.Control(func(fd uintptr) {
		u, uerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peercred: %w", err)
	}
	if uerr != nil {
		return Cred{}, fmt.Errorf("peercred: SO_PEERCRED: %w", uerr)
	}
	cred := Cred{PID: int(u.Pid), UID: int(u.Uid)}
	if euid := os.Geteuid(); cred.UID != euid {
		return cred, fmt.Errorf("peercred: the peer runs as user %d, this process as user %d; its memory is not read: %w", cred.UID, euid, errs.Unauthorized)
	}
	if cred.PID <= 0 {
		return cred, fmt.Errorf("peercred: the peer runs in a PID namespace this process cannot see into (the kernel reports pid 0); its memory is not read: %w", errs.Unauthorized)
	}
	return cred, nil
}

// Prove answers an offer that came over conn from its other end: it dials
// the offer's listener and writes the nonce and conn's endpoints.
func Prove(ctx context.Context, offer []byte, conn net.Conn) error {
	if len(offer) != OfferSize {
		return fmt.Errorf("peercred: an offer of %d bytes, want %d: %w", len(offer), OfferSize, errs.InvalidArgument)
	}
	local, remote, ok := endpoints(conn)
	if !ok {
		return fmt.Errorf("peercred: the connection to prove this process over is not TCP (%v): %w", conn.RemoteAddr(), ErrUnsupported)
	}
	var proof [proofSize]byte
	copy(proof[:NonceSize], offer[nameSize:])
	copy(proof[NonceSize:], local[:])
	copy(proof[NonceSize+endpointSize:], remote[:])
	var d net.Dialer
	uc, err := d.DialContext(ctx, "unix", socketName(offer[:nameSize]))
	if err != nil {
		return fmt.Errorf("peercred: reaching the peer's challenge (not on this machine, or in another network namespace?): %w", err)
	}
	defer uc.Close()
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := uc.Write(proof[:]); err != nil {
		return fmt.Errorf("peercred: sending the proof: %w", err)
	}
	return nil
}

// socketName is the abstract socket name of a challenge.
func socketName(random []byte) string { return namePrefix + hex.EncodeToString(random) }
