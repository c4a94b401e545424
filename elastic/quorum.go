package elastic

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/errs"
)

// The quorum protocol. Keys, under "elastic/<job>/" in the job's store:
//
//	latest         the number of the newest decided round
//	waiting        a counter every member bumps when it wants a place it
//	               does not have (a newcomer, one a round left out, or
//	               one the job went on without);
//	               running members watch it and reconfigure when it grows
//	done           set when the job finished; joiners stop waiting
//	r/<q>/n        round q's join counter: Add 1 gives a member its slot
//	r/<q>/m/<k>    slot k's record: id, committed step and samples
//	r/<q>/result   the round's membership in rank order, written once
//	               (CompareSet from empty), by whichever member decides first
//	r/<q>/pg/...   the round's process group meets here (comm.Init)
//
// A member in round q decides when the round holds everyone it expects
// (the previous round's size plus the newcomers that announced
// themselves), or MaxSize members, or MinSize members and LastCall has
// passed since it joined. Deciding reads the slots, then the waiting
// counter (so a newcomer counted there is either in the result or bumps
// the counter again after it), orders the members so that rank 0 holds the
// most progress, and writes the result; every member reads the one that
// won. A member not in it bumps waiting and goes on to round q+1.
const (
	keyLatest  = "latest"
	keyWaiting = "waiting"
	keyDone    = "done"
)

func roundKey(q int, rest string) string { return "r/" + strconv.Itoa(q) + "/" + rest }

// pollEvery is how often a member in a round looks at it.
const pollEvery = 10 * time.Millisecond

// record is one member's entry in a round.
type record struct {
	ID      string `json:"id"`
	Slot    int64  `json:"slot"`
	Step    int64  `json:"step"`
	Samples int64  `json:"samples"`
	// Fresh: the member has never been in a round (its state is its own
	// initialization), so the round heals it even at step 0.
	Fresh bool `json:"fresh,omitempty"`
}

// result is a decided round.
type result struct {
	Round   int      `json:"round"`
	Members []record `json:"members"` // rank order
	// Waiting is the waiting counter read when the round was decided.
	Waiting int64 `json:"waiting"`
}

func (r *result) rankOf(id string) int {
	for i, m := range r.Members {
		if m.ID == id {
			return i
		}
	}
	return -1
}

// ids lists the members in rank order.
func (r *result) ids() []string {
	out := make([]string, len(r.Members))
	for i, m := range r.Members {
		out[i] = m.ID
	}
	return out
}

// ErrFinished: the job was marked done (Manager.Finish) while this member
// waited for a round.
var ErrFinished = errors.New("elastic: the job has finished")

// counter reads a counter without changing or waiting for it.
func counter(ctx context.Context, st store.Store, key string) (int64, error) {
	return st.Add(ctx, key, 0)
}

// joinRound enters round q with rec and returns the decided round. expected
// is the size at which the round may close at once.
//
// An insider (a member of the round before, or of a round that failed to
// form) may decide the round. An outsider (a newcomer, one a round left
// out, or one the job went on without) only waits for the running members to reconfigure, unless no round
// runs: none was ever decided, or the latest one's members have stopped
// bumping its alive counter for three peer timeouts (they are all gone).
// That keeps a newcomer from forming a second job beside a running one.
func (m *Manager) joinRound(ctx context.Context, q int, rec record, expected int, insider bool, deadline time.Time) (*result, error) {
	st := m.st
	slot, err := st.Add(ctx, roundKey(q, "n"), 1)
	if err != nil {
		return nil, fmt.Errorf("elastic: round %d: taking a slot: %w", q, err)
	}
	rec.Slot = slot
	b, _ := json.Marshal(rec)
	if err := st.Set(ctx, roundKey(q, "m/"+strconv.FormatInt(slot, 10)), b); err != nil {
		return nil, fmt.Errorf("elastic: round %d: recording this member: %w", q, err)
	}
	joined := time.Now()
	resKey := roundKey(q, "result")
	aliveKey, lastAlive, aliveSince := roundKey(q-1, "alive"), int64(-1), time.Now()
	for {
		if ok, err := st.Check(ctx, []string{resKey}); err != nil {
			return nil, fmt.Errorf("elastic: round %d: %w", q, err)
		} else if ok {
			return m.readResult(ctx, q)
		}
		n, err := counter(ctx, st, roundKey(q, "n"))
		if err != nil {
			return nil, fmt.Errorf("elastic: round %d: %w", q, err)
		}
		mayDecide := insider || q == 1
		if !mayDecide {
			a, err := counter(ctx, st, aliveKey)
			if err != nil {
				return nil, fmt.Errorf("elastic: round %d: %w", q, err)
			}
			if a != lastAlive {
				lastAlive, aliveSince = a, time.Now()
			}
			mayDecide = time.Since(aliveSince) >= 3*m.cfg.PeerTimeout
		}
		full := m.cfg.MaxSize > 0 && int(n) >= m.cfg.MaxSize
		if mayDecide && int(n) >= m.cfg.MinSize && (int(n) >= expected || full || time.Since(joined) >= m.cfg.LastCall) {
			return m.decide(ctx, q, n)
		}
		if done, err := st.Check(ctx, []string{keyDone}); err == nil && done {
			return nil, ErrFinished
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: elastic: round %d has %d of the %d members it needs after %v (Config.JoinTimeout); start more members or lower MinSize",
				errs.Timeout, q, n, m.cfg.MinSize, m.cfg.JoinTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("elastic: round %d: %w", q, context.Cause(ctx))
		case <-time.After(pollEvery):
		}
	}
}

// decide writes round q's result from its first n slots, unless another
// member has written it first, and returns the result that stands.
func (m *Manager) decide(ctx context.Context, q int, n int64) (*result, error) {
	st := m.st
	limit := n
	if m.cfg.MaxSize > 0 && limit > int64(m.cfg.MaxSize) {
		limit = int64(m.cfg.MaxSize)
	}
	res := result{Round: q}
	for k := int64(1); k <= limit; k++ {
		key := roundKey(q, "m/"+strconv.FormatInt(k, 10))
		// A member that took a slot and died before recording itself is
		// left out; one still writing its record gets a moment.
		var b []byte
		for try := 0; try < 20; try++ {
			ok, err := st.Check(ctx, []string{key})
			if err != nil {
				return nil, fmt.Errorf("elastic: round %d: %w", q, err)
			}
			if ok {
				if b, err = st.Get(ctx, key); err != nil {
					return nil, fmt.Errorf("elastic: round %d: %w", q, err)
				}
				break
			}
			time.Sleep(pollEvery)
		}
		if b == nil {
			continue
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%w: elastic: round %d: slot %d holds %q: %v", errs.Mismatch, q, k, b, err)
		}
		res.Members = append(res.Members, r)
	}
	w, err := counter(ctx, st, keyWaiting)
	if err != nil {
		return nil, fmt.Errorf("elastic: round %d: %w", q, err)
	}
	res.Waiting = w
	// Rank 0 holds the most progress: the healing source.
	slices.SortStableFunc(res.Members, func(a, b record) int {
		if c := cmp.Compare(b.Step, a.Step); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Samples, a.Samples); c != 0 {
			return c
		}
		return cmp.Compare(a.Slot, b.Slot)
	})
	b, _ := json.Marshal(res)
	if _, err := st.CompareSet(ctx, roundKey(q, "result"), nil, b); err != nil {
		return nil, fmt.Errorf("elastic: round %d: writing the result: %w", q, err)
	}
	return m.readResult(ctx, q)
}

func (m *Manager) readResult(ctx context.Context, q int) (*result, error) {
	b, err := m.st.Get(ctx, roundKey(q, "result"))
	if err != nil {
		return nil, fmt.Errorf("elastic: round %d: reading the result: %w", q, err)
	}
	var res result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%w: elastic: round %d: result %q: %v", errs.Mismatch, q, b, err)
	}
	if err := m.raiseLatest(ctx, q); err != nil {
		return nil, err
	}
	return &res, nil
}

// raiseLatest makes the latest counter at least q.
func (m *Manager) raiseLatest(ctx context.Context, q int) error {
	for {
		cur, err := counter(ctx, m.st, keyLatest)
		if err != nil {
			return fmt.Errorf("elastic: reading the latest round: %w", err)
		}
		if cur >= int64(q) {
			return nil
		}
		old := []byte(strconv.FormatInt(cur, 10))
		if _, err := m.st.CompareSet(ctx, keyLatest, old, []byte(strconv.Itoa(q))); err != nil {
			return fmt.Errorf("elastic: raising the latest round: %w", err)
		}
	}
}

// unknownSize is the expected size of a member that does not know the
// job's current size: it closes on MaxSize or the last call.
const unknownSize = math.MaxInt
