package comm

import (
	"context"
	"fmt"

	"github.com/tandemml/tandem/comm/transport"
)

// reduceReceiver is implemented by transports that can combine a message
// into a buffer straight out of where it arrives (comm/shm's rings), which
// saves the ring all-reduce a copy into a scratch buffer per chunk. reduce
// is called on consecutive pieces of the message, each starting at a
// multiple of 64 bytes.
type reduceReceiver interface {
	RecvReduce(ctx context.Context, peer int, tag transport.Tag, dst []byte, reduce func(dst, src []byte)) error
}

// Ring algorithms. The ring's steps are numbered 0..2(n-1): steps 0..n-2 are
// a reduce-scatter after which rank r holds the full reduction of segment r,
// steps n-1..2n-3 an all-gather that circulates every segment from its
// owner. At every step rank r sends one segment to r+1 and receives one from
// r-1; the segment received at step u is the one sent at step u+1, so each
// chunk is forwarded as soon as it has been received (and reduced): chunks
// pipeline around the ring, sends running in their own goroutine while the
// caller receives and reduces the next chunk. All of it flows under one tag,
// whose ordering keeps the chunks apart.
//
// Every segment is reduced exactly once, along one chain, and then copied to
// every rank, so all ranks end with bit-identical results.

const stepRing = 1

// ringRun runs steps [from, to) of the ring over segs (one per rank). For the
// reduce-scatter steps it reduces with k into segs; finalize, when not nil,
// is applied to each chunk of the owned segment once it is fully reduced.
func ringRun(ctx context.Context, c *opCtx, segs [][]byte, dt dtype, k ReduceKind, from, to int, finalize func([]byte)) error {
	n, r := c.size(), c.rank()
	if from >= to {
		return nil
	}
	next, prev := (r+1)%n, (r+n-1)%n
	mod := func(x int) int { return ((x % n) + n) % n }
	sendSeg := func(u int) int {
		if u < n-1 {
			return mod(r - 1 - u)
		}
		return mod(r - (u - (n - 1)))
	}
	recvSeg := func(u int) int {
		if u < n-1 {
			return mod(r - 2 - u)
		}
		return mod(r - (u - (n - 1)) - 1)
	}
	chunk := c.chunkBytes(dt)
	jobs := 0
	for u := from; u < to; u++ {
		jobs += numChunks(segs[sendSeg(u)], chunk)
	}
	rr := reduceReceiverOf(c.pg.world.t)
	var scratch *[]byte
	if from < n-1 {
		scratch = getScratch(chunk)
		defer putScratch(scratch)
	}
	return withSender(ctx, c, jobs, func(ctx context.Context, s *sender) error {
		first := segs[sendSeg(from)]
		for i := range numChunks(first, chunk) {
			s.push(next, stepRing, chunkOf(first, i, chunk))
		}
		for u := from; u < to; u++ {
			seg := segs[recvSeg(u)]
			for i := range numChunks(seg, chunk) {
				p := chunkOf(seg, i, chunk)
				if u < n-1 {
					if rr != nil {
						// Reduced straight out of where the chunk arrived.
						if err := rr.RecvReduce(ctx, c.pg.members[prev], c.tag(stepRing), p,
							func(d, s []byte) { reduceInto(d, s, dt, k) }); err != nil {
							return fmt.Errorf("receiving %d bytes from rank %d: %w", len(p), prev, err)
						}
					} else {
						tmp := (*scratch)[:len(p)]
						if err := c.recv(ctx, prev, stepRing, tmp); err != nil {
							return err
						}
						reduceInto(p, tmp, dt, k)
					}
					if u == n-2 && finalize != nil {
						finalize(p)
					}
				} else if err := c.recv(ctx, prev, stepRing, p); err != nil {
					return err
				}
				if u+1 < to {
					s.push(next, stepRing, p)
				}
			}
		}
		return nil
	})
}

// splitEven cuts b (elements of es bytes) into n segments whose element
// counts differ by at most one.
func splitEven(b []byte, es, n int) [][]byte {
	elems := len(b) / es
	segs := make([][]byte, n)
	for i := range n {
		lo, hi := i*elems/n, (i+1)*elems/n
		segs[i] = b[lo*es : hi*es]
	}
	return segs
}
