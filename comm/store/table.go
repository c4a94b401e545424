package store

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"sync"
)

// table is the key-value state with c10d semantics that the in-memory store
// and the TCP server share. Blocked readers register a waiter: a callback
// fired once, outside the lock, when every key it waits for exists (or the
// table closes). Nobody polls and no goroutine is parked per key.
//
// Stored values are never modified in place once handed out: Set replaces
// the slice and Append writes only past the length that readers hold.
type table struct {
	mu      sync.Mutex
	data    map[string][]byte
	waiting map[string]map[*waiter]struct{}
	closed  bool
}

// waiter waits for keys to exist.
type waiter struct {
	keys    []string
	missing int
	done    bool
	fire    func()
}

func newTable() *table {
	return &table{data: map[string][]byte{}, waiting: map[string]map[*waiter]struct{}{}}
}

// created records that key now exists and collects waiters that became ready.
// Called with t.mu held.
func (t *table) created(key string, fired []*waiter) []*waiter {
	ws := t.waiting[key]
	if ws == nil {
		return fired
	}
	delete(t.waiting, key)
	for w := range ws {
		w.missing--
		if w.missing == 0 && !w.done {
			w.done = true
			fired = append(fired, w)
		}
	}
	return fired
}

func fireAll(ws []*waiter) {
	for _, w := range ws {
		w.fire()
	}
}

// put stores value under key with t.mu held.
func (t *table) put(key string, value []byte, fired []*waiter) []*waiter {
	_, existed := t.data[key]
	t.data[key] = value
	if !existed {
		fired = t.created(key, fired)
	}
	return fired
}

func (t *table) set(key string, value []byte) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return closedError("set")
	}
	fired := t.put(key, value, nil)
	t.mu.Unlock()
	fireAll(fired)
	return nil
}

func (t *table) multiSet(keys []string, values [][]byte) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return closedError("multi-set")
	}
	var fired []*waiter
	for i, k := range keys {
		fired = t.put(k, values[i], fired)
	}
	t.mu.Unlock()
	fireAll(fired)
	return nil
}

func (t *table) add(key string, delta int64) (int64, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, closedError("add")
	}
	var cur int64
	if v, ok := t.data[key]; ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			t.mu.Unlock()
			return 0, fmt.Errorf("store add: key %q holds %q, not a decimal integer counter: %w",
				key, truncate(v), ErrInvalidArgument)
		}
		cur = n
	}
	if (delta > 0 && cur > math.MaxInt64-delta) || (delta < 0 && cur < math.MinInt64-delta) {
		t.mu.Unlock()
		return 0, fmt.Errorf("store add: counter %q = %d plus %d overflows int64: %w", key, cur, delta, ErrInvalidArgument)
	}
	cur += delta
	fired := t.put(key, []byte(strconv.FormatInt(cur, 10)), nil)
	t.mu.Unlock()
	fireAll(fired)
	return cur, nil
}

func truncate(v []byte) []byte {
	if len(v) > 32 {
		return append(v[:32:32], "..."...)
	}
	return v
}

// compareSet implements c10d's compare-and-set; see Store.CompareSet.
func (t *table) compareSet(key string, expected, desired []byte) ([]byte, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, closedError("compare-set")
	}
	cur, ok := t.data[key]
	var fired []*waiter
	var out []byte
	switch {
	case !ok && len(expected) == 0, ok && bytes.Equal(cur, expected):
		fired = t.put(key, desired, nil)
		out = desired
	case !ok:
		out = expected
	default:
		out = cur
	}
	t.mu.Unlock()
	fireAll(fired)
	return out, nil
}

// appendTo appends value to key's bytes, refusing to grow them beyond limit
// bytes when limit is positive.
func (t *table) appendTo(key string, value []byte, limit int) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return closedError("append")
	}
	cur := t.data[key]
	if n := len(cur) + len(value); limit > 0 && n > limit {
		t.mu.Unlock()
		return fmt.Errorf("store append would grow key %q to %d bytes, over the value limit of %d bytes: %w", key, n, limit, ErrTooLarge)
	}
	nv := append(cur, value...)
	if cur == nil && nv == nil {
		nv = []byte{}
	}
	fired := t.put(key, nv, nil)
	t.mu.Unlock()
	fireAll(fired)
	return nil
}

func (t *table) deleteKey(key string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false, closedError("delete-key")
	}
	_, ok := t.data[key]
	delete(t.data, key)
	return ok, nil
}

func (t *table) numKeys() (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, closedError("num-keys")
	}
	return int64(len(t.data)), nil
}

func (t *table) check(keys []string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false, closedError("check")
	}
	for _, k := range keys {
		if _, ok := t.data[k]; !ok {
			return false, nil
		}
	}
	return true, nil
}

// getOrWait returns the values of keys if they all exist. Otherwise it
// registers a waiter whose fire is called exactly once, from another
// goroutine, when they all exist or the table closes, and returns it; the
// caller then calls getOrWait again (a key may have been deleted meanwhile)
// or gives up with cancel. fire must not block.
func (t *table) getOrWait(keys []string, fire func()) ([][]byte, *waiter, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, nil, closedError("get")
	}
	vals := make([][]byte, len(keys))
	w := &waiter{keys: keys, fire: fire}
	for i, k := range keys {
		v, ok := t.data[k]
		if !ok {
			w.missing++
			continue
		}
		vals[i] = v
	}
	if w.missing == 0 {
		return vals, nil, nil
	}
	for _, k := range keys {
		if _, ok := t.data[k]; ok {
			continue
		}
		ws := t.waiting[k]
		if ws == nil {
			ws = map[*waiter]struct{}{}
			t.waiting[k] = ws
		}
		if _, dup := ws[w]; dup {
			w.missing-- // the same key named twice counts once
			continue
		}
		ws[w] = struct{}{}
	}
	return nil, w, nil
}

// cancel withdraws w and reports whether it had not fired yet.
func (t *table) cancel(w *waiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.done {
		return false
	}
	w.done = true
	for _, k := range w.keys {
		if ws := t.waiting[k]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(t.waiting, k)
			}
		}
	}
	return true
}

// close refuses every later call and fires every waiter, whose next
// getOrWait then reports ErrClosed.
func (t *table) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	var fired []*waiter
	for _, ws := range t.waiting {
		for w := range ws {
			if !w.done {
				w.done = true
				fired = append(fired, w)
			}
		}
	}
	t.waiting = nil
	t.data = nil
	t.mu.Unlock()
	fireAll(fired)
}
