// Package transporttest checks that a comm backend keeps the point-to-point
// contract of transport.Transport, as testing/fstest checks a file system:
// a backend's tests call Run with a function that connects a world of n
// ranks, and every case of the contract runs against it. comm/local,
// comm/tcp and comm/shm run it; a new backend proves itself with it before
// it meets the collective suite (commtest.RunConformance).
//
// The cases: per-tag ordering; buffering of messages that arrive before their
// receive; a posted receive getting the message; sends to oneself and empty
// messages; many tags between every pair at once; a length mismatch that
// leaves the stream in step; deadlines and cancellation (a withdrawn receive
// takes nothing); peers outside the world; Abort reaching every peer; Close
// failing pending operations and telling the peers; large messages received
// out of order, crossing, and far above any buffer or ring.
package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
)

// Factory connects a world of n ranks (n is 1 to 4) and returns their
// transports, indexed by rank. It fails t if it cannot, and arranges for the
// transports to be closed when t ends (a second Close must be harmless).
type Factory func(t *testing.T, n int) []transport.Transport

// Connect is a Factory body for any transport.Backend: every rank connects
// from its own goroutine through a fresh in-memory store, with cfg (may be
// nil) adjusting rank r's transport.Config first.
func Connect(t *testing.T, b transport.Backend, n int, cfg func(rank int, c *transport.Config)) []transport.Transport {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := make([]transport.Transport, n)
	errs := testkit.EachRank(n, func(r int) error {
		c := transport.Config{Rank: r, Size: n, Store: st}
		if cfg != nil {
			cfg(r, &c)
		}
		var err error
		ts[r], err = b.Connect(ctx, c)
		return err
	})
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
	})
	for r, err := range errs {
		require.NoErrorf(t, err, "rank %d: connect", r)
	}
	return ts
}

// Run runs every case of the contract, each as a subtest with a world of its
// own.
func Run(t *testing.T, connect Factory) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Factory)
	}{
		{"RankAndSize", testRankAndSize},
		{"OrderPerTag", testOrderPerTag},
		{"ArrivedFirstAreBuffered", testBuffered},
		{"PostedReceive", testPostedReceive},
		{"SelfAndEmpty", testSelfAndEmpty},
		{"ConcurrentTagsAllPairs", testConcurrentTagsAllPairs},
		{"LengthMismatch", testLengthMismatch},
		{"Context", testContext},
		{"PeerOutsideWorld", testPeerOutsideWorld},
		{"Abort", testAbort},
		{"AbortThenCloseTwice", testAbortThenCloseTwice},
		{"Close", testClose},
		{"LargeOutOfOrder", testLargeOutOfOrder},
		{"LargeCrossing", testLargeCrossing},
		{"Big", testBig},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, connect) })
	}
}

// Payload returns n pseudo-random bytes determined by seed, cheaply even
// under the race detector.
func Payload(seed, n int) []byte {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], uint64(seed))
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b)
	return b
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testRankAndSize(t *testing.T, connect Factory) {
	for _, n := range []int{1, 3} {
		ts := connect(t, n)
		require.Len(t, ts, n)
		for r, tr := range ts {
			assert.Equal(t, r, tr.Rank())
			assert.Equal(t, n, tr.Size())
		}
	}
}

// testOrderPerTag: messages from one peer under one tag arrive in the order
// sent, whether they reach the receiver before or after its Recv.
func testOrderPerTag(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 30*time.Second)
	const n = 200
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(i))
			if err := ts[0].Send(ctx, 1, 7, b[:]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range n {
		if i == n/2 {
			time.Sleep(20 * time.Millisecond) // let some arrive before their Recv
		}
		var b [8]byte
		require.NoErrorf(t, ts[1].Recv(ctx, 0, 7, b[:]), "recv %d", i)
		require.Equalf(t, uint64(i), binary.LittleEndian.Uint64(b[:]), "message %d: order broken", i)
	}
	require.NoError(t, <-errc)
}

// testBuffered: every message is sent before any receive is posted, and
// received in the reverse order of tags.
func testBuffered(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 30*time.Second)
	const tags = 20
	for tag := range tags {
		require.NoError(t, ts[0].Send(ctx, 1, transport.Tag(tag), Payload(tag, 100+tag)))
	}
	for tag := tags - 1; tag >= 0; tag-- {
		buf := make([]byte, 100+tag)
		require.NoError(t, ts[1].Recv(ctx, 0, transport.Tag(tag), buf))
		require.Truef(t, bytes.Equal(buf, Payload(tag, 100+tag)), "tag %d: payload corrupted", tag)
	}
}

// testPostedReceive: a receive posted first gets the message, and the
// sender's buffer is the sender's again once Send returns.
func testPostedReceive(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 10*time.Second)
	got := make(chan error, 1)
	b := make([]byte, 3)
	go func() { got <- ts[0].Recv(ctx, 1, 1, b) }()
	time.Sleep(10 * time.Millisecond)
	msg := []byte{1, 2, 3}
	require.NoError(t, ts[1].Send(ctx, 0, 1, msg))
	msg[0] = 9
	require.NoError(t, <-got)
	assert.Equal(t, []byte{1, 2, 3}, b)
}

// testSelfAndEmpty: a rank may send to itself, the payload is copied at
// Send, a receive posted first gets it directly; empty messages travel too.
func testSelfAndEmpty(t *testing.T, connect Factory) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("world=%d", n), func(t *testing.T) {
			ts := connect(t, n)
			ctx := ctxFor(t, 10*time.Second)
			me := ts[n-1]
			self := n - 1
			src := Payload(1, 1000)
			require.NoError(t, me.Send(ctx, self, 3, src))
			src[0]++ // the transport must have copied
			dst := make([]byte, 1000)
			require.NoError(t, me.Recv(ctx, self, 3, dst))
			require.Equal(t, Payload(1, 1000), dst, "self-send payload wrong or not copied")
			done := make(chan error, 1)
			go func() { done <- me.Recv(ctx, self, 4, dst) }()
			time.Sleep(10 * time.Millisecond)
			require.NoError(t, me.Send(ctx, self, 4, Payload(2, 1000)))
			require.NoError(t, <-done)
			require.Equal(t, Payload(2, 1000), dst, "posted self receive")
			require.NoError(t, me.Send(ctx, 0, 2, nil))
			require.NoError(t, ts[0].Recv(ctx, self, 2, nil))
		})
	}
}

// testConcurrentTagsAllPairs: every rank sends to every rank (itself
// included) under several tags at once; each stream arrives whole and in
// order.
func testConcurrentTagsAllPairs(t *testing.T, connect Factory) {
	const world, tags, rounds = 4, 8, 20
	ts := connect(t, world)
	ctx := ctxFor(t, 60*time.Second)
	var wg sync.WaitGroup
	errc := make(chan error, world*world*tags*2)
	for src := range world {
		for dst := range world {
			for tag := range tags {
				seed := func(i int) int { return src*1000 + dst*100 + tag*10 + i }
				wg.Go(func() {
					for i := range rounds {
						if err := ts[src].Send(ctx, dst, transport.Tag(tag), Payload(seed(i), 512+tag)); err != nil {
							errc <- err
							return
						}
					}
				})
				wg.Go(func() {
					buf := make([]byte, 512+tag)
					for i := range rounds {
						if err := ts[dst].Recv(ctx, src, transport.Tag(tag), buf); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(buf, Payload(seed(i), 512+tag)) {
							errc <- fmt.Errorf("%d->%d tag %d round %d: wrong payload", src, dst, tag, i)
							return
						}
					}
				})
			}
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// testLengthMismatch: a receive whose buffer is not the message's length
// fails with ErrMismatch stating both lengths, whether the message came
// first or the receive, and the stream stays in step.
func testLengthMismatch(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 10*time.Second)
	require.NoError(t, ts[0].Send(ctx, 1, 9, make([]byte, 10)))
	time.Sleep(20 * time.Millisecond)
	err := ts[1].Recv(ctx, 0, 9, make([]byte, 12))
	require.ErrorIs(t, err, transport.ErrMismatch)
	assert.ErrorContains(t, err, "10 bytes")
	assert.ErrorContains(t, err, "12 bytes")
	errc := make(chan error, 1)
	go func() { errc <- ts[1].Recv(ctx, 0, 9, make([]byte, 5)) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ts[0].Send(ctx, 1, 9, make([]byte, 7)))
	err = <-errc
	require.ErrorIs(t, err, transport.ErrMismatch)
	assert.ErrorContains(t, err, "7 bytes")
	assert.ErrorContains(t, err, "5 bytes")
	require.NoError(t, ts[0].Send(ctx, 1, 9, []byte("ok")))
	b := make([]byte, 2)
	require.NoError(t, ts[1].Recv(ctx, 0, 9, b))
	assert.Equal(t, "ok", string(b), "after a mismatch")
}

// testContext: a receive past its deadline fails with ErrTimeout wrapping
// context.DeadlineExceeded and, withdrawn, neither takes nor writes the next
// message; an operation under a cancelled context fails with
// context.Canceled.
func testContext(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 10*time.Second)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	b := make([]byte, 4)
	err := ts[1].Recv(short, 0, 1, b)
	require.ErrorIs(t, err, transport.ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, ts[0].Send(ctx, 1, 1, []byte("abcd")))
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, make([]byte, 4), b, "a withdrawn receive's buffer was written")
	c := make([]byte, 4)
	require.NoError(t, ts[1].Recv(ctx, 0, 1, c))
	require.Equal(t, "abcd", string(c), "after a timed-out receive")

	dead, cancelDead := context.WithCancel(ctx)
	cancelDead()
	assert.ErrorIs(t, ts[0].Send(dead, 1, 2, c), context.Canceled, "send under a cancelled context")
	assert.ErrorIs(t, ts[1].Recv(dead, 0, 2, c), context.Canceled, "receive under a cancelled context")
}

// testPeerOutsideWorld: a peer rank outside [0, Size) is an invalid argument.
func testPeerOutsideWorld(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 10*time.Second)
	for _, peer := range []int{-1, 2} {
		assert.ErrorIsf(t, ts[0].Send(ctx, peer, 1, []byte("x")), transport.ErrInvalidArgument, "send to rank %d", peer)
		assert.ErrorIsf(t, ts[0].Recv(ctx, peer, 1, make([]byte, 1)), transport.ErrInvalidArgument, "receive from rank %d", peer)
	}
}

// testAbort: Abort fails the aborting rank's pending and future operations
// with its cause, and every peer's operations with that rank with
// ErrPeerAborted (an ErrPeerLost) naming the cause, promptly; the other
// ranks still talk.
func testAbort(t *testing.T, connect Factory) {
	ts := connect(t, 3)
	ctx := ctxFor(t, 10*time.Second)
	peers := make(chan error, 2)
	own := make(chan error, 1)
	go func() { peers <- ts[0].Recv(ctx, 1, 5, make([]byte, 8)) }()
	go func() { peers <- ts[2].Recv(ctx, 1, 5, make([]byte, 8)) }()
	go func() { own <- ts[1].Recv(ctx, 0, 6, make([]byte, 8)) }()
	time.Sleep(50 * time.Millisecond)
	cause := errors.New("loss is NaN")
	start := time.Now()
	ts[1].Abort(cause)
	err := <-own
	assert.ErrorIs(t, err, cause, "the aborting rank's pending receive")
	assert.ErrorContains(t, err, "rank 1 aborted")
	for range 2 {
		err := <-peers
		assert.ErrorIs(t, err, transport.ErrPeerLost, "a peer's pending receive from the aborted rank")
		assert.ErrorIs(t, err, transport.ErrPeerAborted, "a peer's pending receive from the aborted rank")
		assert.ErrorContains(t, err, "aborted")
		assert.ErrorContains(t, err, "loss is NaN")
	}
	assert.Less(t, time.Since(start), 5*time.Second, "the abort took too long to reach the peers")
	assert.ErrorIs(t, ts[1].Send(ctx, 0, 1, []byte("x")), cause, "send after abort")
	assert.ErrorIs(t, ts[0].Send(ctx, 1, 1, []byte("x")), transport.ErrPeerLost, "send to an aborted peer")
	require.NoError(t, ts[0].Send(ctx, 2, 1, []byte("x")))
	require.NoError(t, ts[2].Recv(ctx, 0, 1, make([]byte, 1)), "ranks 0 and 2 after rank 1 aborted")
}

// testAbortThenCloseTwice: a second Abort changes nothing, Close after Abort
// and a second Close return nil, and operations go on reporting the abort.
func testAbortThenCloseTwice(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ts[0].Abort(errors.New("stop"))
	ts[0].Abort(errors.New("again"))
	require.NoError(t, ts[0].Close())
	require.NoError(t, ts[0].Close())
	assert.ErrorContains(t, ts[0].Send(ctxFor(t, 10*time.Second), 1, 1, nil), "stop", "after abort then close, operations report the abort")
}

// testClose: Close fails the closing rank's pending operations with
// ErrClosed and its later ones too; a peer's pending receive fails with
// ErrPeerLost saying the rank closed its transport, and what the closed rank
// had sent before is still received first.
func testClose(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 10*time.Second)
	require.NoError(t, ts[0].Send(ctx, 1, 2, []byte("last words")))
	local := make(chan error, 1)
	remote := make(chan error, 1)
	go func() { local <- ts[0].Recv(ctx, 1, 1, make([]byte, 8)) }()
	go func() { remote <- ts[1].Recv(ctx, 0, 1, make([]byte, 8)) }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ts[0].Close())
	assert.ErrorIs(t, <-local, transport.ErrClosed, "pending receive on the closed side")
	err := <-remote
	assert.ErrorIs(t, err, transport.ErrPeerLost, "pending receive on the peer")
	assert.NotErrorIs(t, err, transport.ErrPeerAborted, "pending receive on the peer of a rank that closed")
	assert.ErrorContains(t, err, "rank 0 closed its transport")
	assert.ErrorIs(t, ts[0].Send(ctx, 1, 1, nil), transport.ErrClosed, "send after Close")
	b := make([]byte, 10)
	require.NoError(t, ts[1].Recv(ctx, 0, 2, b), "a message sent before Close")
	assert.Equal(t, "last words", string(b))
	assert.ErrorIs(t, ts[1].Recv(ctx, 0, 2, b), transport.ErrPeerLost, "receive from a closed peer")
	require.NoError(t, ts[0].Close(), "second Close")
}

// testLargeOutOfOrder: large messages received in another order than sent
// arrive intact: a receive waiting behind an unclaimed large message gets
// through.
func testLargeOutOfOrder(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 30*time.Second)
	const size = 1 << 20
	sent := make(chan error, 1)
	go func() {
		for tag := 1; tag <= 3; tag++ {
			if err := ts[0].Send(ctx, 1, transport.Tag(tag), Payload(tag, size)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for _, tag := range []int{3, 1, 2} {
		buf := make([]byte, size)
		require.NoError(t, ts[1].Recv(ctx, 0, transport.Tag(tag), buf))
		require.Truef(t, bytes.Equal(buf, Payload(tag, size)), "tag %d: payload corrupted", tag)
	}
	require.NoError(t, <-sent)
}

// testLargeCrossing: two ranks that each send the other a large message
// before receiving both complete: the transport takes in what arrives before
// its receive.
func testLargeCrossing(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 30*time.Second)
	const size = 4 << 20
	testkit.RequireEachRank(t, 2, func(r int) error {
		if err := ts[r].Send(ctx, 1-r, 3, Payload(r, size)); err != nil {
			return err
		}
		got := make([]byte, size)
		if err := ts[r].Recv(ctx, 1-r, 3, got); err != nil {
			return err
		}
		if !bytes.Equal(got, Payload(1-r, size)) {
			return errors.New("received a corrupted message")
		}
		return nil
	})
}

// testBig: a 64 MiB message arrives intact, with the receive posted first
// and with the message first.
func testBig(t *testing.T, connect Factory) {
	ts := connect(t, 2)
	ctx := ctxFor(t, 60*time.Second)
	const size = 64 << 20
	src := Payload(3, size)
	dst := make([]byte, size)
	for _, posted := range []bool{true, false} {
		t.Run(fmt.Sprintf("recv-posted-first=%v", posted), func(t *testing.T) {
			clear(dst)
			errc := make(chan error, 1)
			if posted {
				go func() {
					time.Sleep(50 * time.Millisecond)
					errc <- ts[0].Send(ctx, 1, 1, src)
				}()
			} else {
				errc <- ts[0].Send(ctx, 1, 1, src)
			}
			require.NoError(t, ts[1].Recv(ctx, 0, 1, dst))
			require.NoError(t, <-errc)
			require.True(t, bytes.Equal(dst, src), "64 MiB payload corrupted")
		})
	}
}
