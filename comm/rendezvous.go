package comm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// Rendezvous: how the ranks of a new world meet in the store before their
// backend connects. Keys, under the store view Init hands in:
//
//	rdzv/rank/<r>     claimed by rank r with CompareSet: "world=N host=H pid=P id=X"
//	rdzv/world_size   recorded by rank 0; every other rank compares its own
//	rdzv/failed       the first rank that finds the job misconfigured says why
//	rdzv/ready/<r>    set by rank r once its backend is connected
//
// A second process claiming a taken rank fails with ErrMismatch naming the
// first; a rank whose world size differs from rank 0's (or from any claim)
// fails with ErrMismatch naming both sizes; ranks that never arrive within
// the timeout are listed in an error wrapping ErrTimeout. A rank that finds
// the job misconfigured records why under rdzv/failed, so the others stop
// waiting at once instead of timing out.
const (
	keyRankBase  = "rdzv/rank/"
	keyWorldSize = "rdzv/world_size"
	keyFailed    = "rdzv/failed"
	keyReadyBase = "rdzv/ready/"
)

// pollSlice is how often a waiting rank checks rdzv/failed.
const pollSlice = 250 * time.Millisecond

type rendezvous struct {
	st          store.Store
	rank, world int
	where       string        // the store, for messages
	timeout     time.Duration // for messages
	staleHint   string        // added to a duplicate-rank error: how to clear a leftover store

	claims [][]byte      // every rank's claim, once join has read them
	took   time.Duration // how long run took, once it succeeded
}

func rankKeys(base string, n int) []string {
	keys := make([]string, n)
	for r := range keys {
		keys[r] = base + strconv.Itoa(r)
	}
	return keys
}

// join claims this rank, checks the world size and waits for every rank.
func (r *rendezvous) join(ctx context.Context) error {
	host, _ := os.Hostname()
	var id [8]byte
	rand.Read(id[:])
	claim := []byte(fmt.Sprintf("world=%d host=%s pid=%d id=%s", r.world, host, os.Getpid(), hex.EncodeToString(id[:])))
	got, err := r.st.CompareSet(ctx, keyRankBase+strconv.Itoa(r.rank), nil, claim)
	if err != nil {
		return r.storeErr(ctx, "claiming its rank", err)
	}
	if !bytes.Equal(got, claim) {
		return fmt.Errorf("comm: init: rank %d is already taken by another process (%s) in %s: two processes were started with rank %d; give every process its own RANK%s: %w",
			r.rank, describeClaim(got), r.where, r.rank, r.staleHint, ErrMismatch)
	}

	want := []byte(strconv.Itoa(r.world))
	if r.rank == 0 {
		got, err := r.st.CompareSet(ctx, keyWorldSize, nil, want)
		if err != nil {
			return r.storeErr(ctx, "recording the world size", err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("comm: init: rank 0 has world size %d but %s already records world size %s: is it left over from another job? Use a fresh store (another MASTER_PORT)%s: %w",
				r.world, r.where, got, r.staleHint, ErrMismatch)
		}
	} else {
		vals, err := r.wait(ctx, []string{keyWorldSize}, keyRankBase, "never arrived")
		if err != nil {
			return err
		}
		if !bytes.Equal(vals[0], want) {
			return fmt.Errorf("comm: init: world size mismatch: rank %d has world size %d but rank 0 has world size %s; start every rank with the same WORLD_SIZE: %w",
				r.rank, r.world, vals[0], ErrMismatch)
		}
	}

	claims, err := r.wait(ctx, rankKeys(keyRankBase, r.world), keyRankBase, "never arrived")
	if err != nil {
		return err
	}
	for peer, c := range claims {
		if w := claimWorld(c); w != r.world {
			return fmt.Errorf("comm: init: world size mismatch: rank %d has world size %d but rank %d has world size %d; start every rank with the same WORLD_SIZE: %w",
				r.rank, r.world, peer, w, ErrMismatch)
		}
	}
	r.claims = claims
	return nil
}

// logMet logs, at launch.DebugInfo and above, on pg's logger, who met in
// the rendezvous that made pg's world: every rank's host and process, the
// world size, the store and how long the meeting took.
func (r *rendezvous) logMet(pg *ProcessGroup) {
	if pg.DebugLevel() < launch.DebugInfo {
		return
	}
	ranks := make([]string, len(r.claims))
	for i, c := range r.claims {
		ranks[i] = fmt.Sprintf("%d: %s", i, describeClaim(c))
	}
	pg.Logger().Info("comm: rendezvous done", "rank", r.rank, "world_size", r.world, "store", r.where,
		"took", r.took, "ranks", strings.Join(ranks, "; "))
}

// ready marks this rank's backend as connected and waits for every rank's,
// so that no rank leaves (and rank 0 cannot close the store) while another
// still needs the store to connect.
func (r *rendezvous) ready(ctx context.Context) error {
	if err := r.st.Set(ctx, keyReadyBase+strconv.Itoa(r.rank), []byte("1")); err != nil {
		return r.storeErr(ctx, "reporting it is connected", err)
	}
	_, err := r.wait(ctx, rankKeys(keyReadyBase, r.world), keyReadyBase, "never finished connecting")
	return err
}

// wait gets keys, waiting until ctx ends even when the store's own default
// timeout is shorter. On timeout it lists the ranks whose base+rank key is
// missing.
func (r *rendezvous) wait(ctx context.Context, keys []string, base, missingWhat string) ([][]byte, error) {
	for {
		err := r.st.Wait(ctx, keys, 0)
		if ctx.Err() != nil {
			return nil, r.missing(ctx, base, missingWhat)
		}
		if err == nil {
			vals, err := r.st.MultiGet(ctx, keys)
			if err != nil {
				return nil, r.storeErr(ctx, "reading the rendezvous keys", err)
			}
			return vals, nil
		}
		if !errors.Is(err, ErrTimeout) {
			return nil, r.storeErr(ctx, "waiting for the other ranks", err)
		}
	}
}

// missing builds the timeout error naming the ranks whose key never appeared.
func (r *rendezvous) missing(ctx context.Context, base, what string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var absent []int
	var unreachable error
	for peer := 0; peer < r.world && unreachable == nil; peer++ {
		ok, err := r.st.Check(cctx, []string{base + strconv.Itoa(peer)})
		switch {
		case err != nil:
			unreachable = err
		case !ok:
			absent = append(absent, peer)
		}
	}
	msg := fmt.Sprintf("comm: init: rank %d of %d: ", r.rank, r.world)
	switch {
	case unreachable != nil:
		msg += "the rendezvous did not complete, and the store no longer answers (did rank 0 give up or exit?)"
	case len(absent) > 0:
		msg += fmt.Sprintf("ranks %v %s", absent, what)
	default:
		msg += "the rendezvous did not complete"
	}
	msg += fmt.Sprintf(" (waited up to %v at %s); check that every rank was started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE", r.timeout, r.where)
	if unreachable != nil {
		return errs.Wrap(ctx, msg, unreachable)
	}
	return errs.FromContext(ctx, msg)
}

// watch polls rdzv/failed until stop is called; when another rank records a
// failure it cancels ctx with that failure as the cause.
func (r *rendezvous) watch(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(pollSlice)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if ok, err := r.st.Check(ctx, []string{keyFailed}); err != nil || !ok {
				continue
			}
			if v, err := r.st.Get(ctx, keyFailed); err == nil {
				cancel(relayedFailure(r.rank, v))
				return
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// post records err as the job's failure for the other ranks (the first one
// recorded wins). Timeouts and cancellations are not recorded: the other
// ranks see their own timeout.
func (r *rendezvous) post(ctx context.Context, err error) {
	if errors.Is(err, ErrTimeout) || errors.Is(err, context.Canceled) {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	kind := "peer_lost"
	for _, k := range failureKinds {
		if errors.Is(err, k.sentinel) {
			kind = k.name
			break
		}
	}
	r.st.CompareSet(cctx, keyFailed, nil, []byte(fmt.Sprintf("%s|rank %d: %v", kind, r.rank, err)))
}

var failureKinds = []struct {
	name     string
	sentinel error
}{
	{"mismatch", ErrMismatch}, {"unauthorized", ErrUnauthorized}, {"invalid", ErrInvalidArgument}, {"too_large", ErrTooLarge},
}

// relayedFailure turns a recorded failure into this rank's error, wrapping
// the sentinel of the rank that recorded it.
func relayedFailure(rank int, v []byte) error {
	kind, text, _ := strings.Cut(string(v), "|")
	sentinel := ErrPeerLost
	for _, k := range failureKinds {
		if k.name == kind {
			sentinel = k.sentinel
		}
	}
	return fmt.Errorf("comm: init: rank %d: another rank found the job misconfigured: %s: %w", rank, text, sentinel)
}

func (r *rendezvous) storeErr(ctx context.Context, doing string, err error) error {
	if ctx.Err() != nil {
		return r.missing(ctx, keyRankBase, "never arrived")
	}
	return fmt.Errorf("comm: init: rank %d %s in %s: %w", r.rank, doing, r.where, err)
}

// claimWorld returns the world size recorded in a rank claim, or -1.
func claimWorld(c []byte) int {
	for _, f := range strings.Fields(string(c)) {
		if v, ok := strings.CutPrefix(f, "world="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// describeClaim turns a claim into "host H, pid P" for messages.
func describeClaim(c []byte) string {
	var host, pid string
	for _, f := range strings.Fields(string(c)) {
		if v, ok := strings.CutPrefix(f, "host="); ok {
			host = v
		}
		if v, ok := strings.CutPrefix(f, "pid="); ok {
			pid = v
		}
	}
	if host == "" && pid == "" {
		return fmt.Sprintf("claim %q", c)
	}
	return fmt.Sprintf("host %s, pid %s", host, pid)
}

// lingerAfterFailure is how long the rank that serves the store keeps it up
// after a failure, so that the others can read why (or list who is missing).
const lingerAfterFailure = 4 * pollSlice

// run is the whole meeting: join, connect (the backend, through the store),
// then wait until every rank is connected. While it runs, a watcher relays a
// failure recorded by any other rank; a failure of this rank is recorded for
// the others. serving says that this rank serves the store and must keep it
// up a moment after a failure.
func (r *rendezvous) run(ctx context.Context, connect func(context.Context) (transport.Transport, error), serving bool) (transport.Transport, error) {
	began := time.Now()
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := r.watch(rctx, cancel)
	err := r.join(rctx)
	var tr transport.Transport
	if err == nil {
		tr, err = connect(rctx)
	}
	if err == nil {
		err = r.ready(rctx)
	}
	stop()
	if err == nil {
		r.took = time.Since(began)
		return tr, nil
	}
	if tr != nil {
		tr.Close()
	}
	if rctx.Err() != nil && ctx.Err() == nil {
		// Stopped by the watcher: report the other rank's failure.
		err = context.Cause(rctx)
	} else {
		r.post(ctx, err)
	}
	if serving {
		t := time.NewTimer(lingerAfterFailure)
		defer t.Stop()
		<-t.C // ctx may have ended already: this is the grace after it
	}
	return nil, err
}
