package store

import (
	"context"
	"time"
)

// Memory is an in-process store, c10d's HashStore: ranks that are goroutines
// of one process rendezvous through it. It is safe for concurrent use.
type Memory struct {
	t       *table
	timeout time.Duration
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store. WithTimeout sets the default
// bound of blocking calls; other options are ignored.
func NewMemory(opts ...Option) *Memory {
	cfg := newConfig(opts)
	return &Memory{t: newTable(), timeout: cfg.timeout}
}

func clone(b []byte) []byte {
	out := make([]byte, len(b))
	copy(out, b)
	return out
}

func (m *Memory) enter(ctx context.Context, op string) error {
	return enter(ctx, op)
}

// Set implements Store.
func (m *Memory) Set(ctx context.Context, key string, value []byte) error {
	if err := m.enter(ctx, "set"); err != nil {
		return err
	}
	return m.t.set(key, clone(value))
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, key string) ([]byte, error) {
	vals, err := m.block(ctx, "get", []string{key}, 0)
	if err != nil {
		return nil, err
	}
	return clone(vals[0]), nil
}

// Add implements Store.
func (m *Memory) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := m.enter(ctx, "add"); err != nil {
		return 0, err
	}
	return m.t.add(key, delta)
}

// CompareSet implements Store.
func (m *Memory) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := m.enter(ctx, "compare-set"); err != nil {
		return nil, err
	}
	v, err := m.t.compareSet(key, expected, clone(desired))
	if err != nil {
		return nil, err
	}
	return clone(v), nil
}

// DeleteKey implements Store.
func (m *Memory) DeleteKey(ctx context.Context, key string) (bool, error) {
	if err := m.enter(ctx, "delete-key"); err != nil {
		return false, err
	}
	return m.t.deleteKey(key)
}

// NumKeys implements Store.
func (m *Memory) NumKeys(ctx context.Context) (int64, error) {
	if err := m.enter(ctx, "num-keys"); err != nil {
		return 0, err
	}
	return m.t.numKeys()
}

// Check implements Store.
func (m *Memory) Check(ctx context.Context, keys []string) (bool, error) {
	if err := m.enter(ctx, "check"); err != nil {
		return false, err
	}
	return m.t.check(keys)
}

// Wait implements Store.
func (m *Memory) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	_, err := m.block(ctx, "wait", keys, timeout)
	return err
}

// MultiSet implements Store.
func (m *Memory) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if err := m.enter(ctx, "multi-set"); err != nil {
		return err
	}
	if err := checkMulti("multi-set", keys, values); err != nil {
		return err
	}
	vs := make([][]byte, len(values))
	for i, v := range values {
		vs[i] = clone(v)
	}
	return m.t.multiSet(keys, vs)
}

// MultiGet implements Store.
func (m *Memory) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	vals, err := m.block(ctx, "multi-get", keys, 0)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = clone(v)
	}
	return out, nil
}

// Append implements Store.
func (m *Memory) Append(ctx context.Context, key string, value []byte) error {
	if err := m.enter(ctx, "append"); err != nil {
		return err
	}
	return m.t.appendTo(key, value, 0)
}

// Close implements Store: blocked calls return ErrClosed, as do later ones.
func (m *Memory) Close() error {
	m.t.close()
	return nil
}

// block waits until every key exists and returns their values.
func (m *Memory) block(ctx context.Context, op string, keys []string, timeout time.Duration) ([][]byte, error) {
	if err := m.enter(ctx, op); err != nil {
		return nil, err
	}
	dl, ctxBound := deadline(ctx, timeout, m.timeout)
	if timeout <= 0 {
		timeout = m.timeout
	}
	var timer *time.Timer
	for {
		ready := make(chan struct{})
		vals, w, err := m.t.getOrWait(keys, func() { close(ready) })
		if err != nil {
			return nil, err
		}
		if w == nil {
			if timer != nil {
				timer.Stop()
			}
			return vals, nil
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(dl))
			defer timer.Stop()
		}
		select {
		case <-ready:
		case <-ctx.Done():
			m.t.cancel(w)
			return nil, waitError(ctx, op, keys, timeout, ctxBound)
		case <-timer.C:
			m.t.cancel(w)
			return nil, waitError(ctx, op, keys, timeout, ctxBound)
		}
	}
}
