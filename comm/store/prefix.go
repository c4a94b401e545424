package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// Prefix namespaces another store, c10d's PrefixStore: every key k becomes
// "prefix/k" in the underlying store, so that several groups or jobs can share
// one store without their keys colliding.
//
// NumKeys returns the number of keys in the whole underlying store, not only
// those under the prefix (as c10d does: stores cannot list keys). Close marks
// the prefix store closed but leaves the underlying store open; its owner
// closes it.
type Prefix struct {
	prefix string
	s      Store
	closed atomic.Bool
	// done ends when the view is closed, releasing calls blocked in it.
	done   context.Context
	cancel context.CancelFunc
}

var _ Store = (*Prefix)(nil)

// NewPrefix returns a store that reads and writes s under "prefix/".
func NewPrefix(prefix string, s Store) Store {
	done, cancel := context.WithCancel(context.Background())
	return &Prefix{prefix: prefix + "/", s: s, done: done, cancel: cancel}
}

// blocking runs a blocking call of the underlying store under a context that
// also ends when this view is closed, and reports ErrClosed in that case.
func (p *Prefix) blocking(ctx context.Context, op string, call func(ctx context.Context) error) error {
	if err := p.check(op); err != nil {
		return err
	}
	if err := errs.CheckContext(ctx, "store", op); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.done, cancel)
	defer stop()
	err := call(ctx)
	if err != nil && p.closed.Load() {
		return fmt.Errorf("%w (%w)", closedError(op), err)
	}
	return err
}

func (p *Prefix) key(k string) string { return p.prefix + k }

func (p *Prefix) keys(ks []string) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = p.prefix + k
	}
	return out
}

func (p *Prefix) check(op string) error {
	if p.closed.Load() {
		return closedError(op)
	}
	return nil
}

// Set implements Store.
func (p *Prefix) Set(ctx context.Context, key string, value []byte) error {
	if err := p.check("set"); err != nil {
		return err
	}
	return p.s.Set(ctx, p.key(key), value)
}

// Get implements Store.
func (p *Prefix) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := p.blocking(ctx, "get", func(ctx context.Context) (err error) {
		v, err = p.s.Get(ctx, p.key(key))
		return err
	})
	return v, err
}

// Add implements Store.
func (p *Prefix) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := p.check("add"); err != nil {
		return 0, err
	}
	return p.s.Add(ctx, p.key(key), delta)
}

// CompareSet implements Store.
func (p *Prefix) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := p.check("compare-set"); err != nil {
		return nil, err
	}
	return p.s.CompareSet(ctx, p.key(key), expected, desired)
}

// DeleteKey implements Store.
func (p *Prefix) DeleteKey(ctx context.Context, key string) (bool, error) {
	if err := p.check("delete-key"); err != nil {
		return false, err
	}
	return p.s.DeleteKey(ctx, p.key(key))
}

// NumKeys implements Store; it counts every key of the underlying store.
func (p *Prefix) NumKeys(ctx context.Context) (int64, error) {
	if err := p.check("num-keys"); err != nil {
		return 0, err
	}
	return p.s.NumKeys(ctx)
}

// Check implements Store.
func (p *Prefix) Check(ctx context.Context, keys []string) (bool, error) {
	if err := p.check("check"); err != nil {
		return false, err
	}
	return p.s.Check(ctx, p.keys(keys))
}

// Wait implements Store.
func (p *Prefix) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	return p.blocking(ctx, "wait", func(ctx context.Context) error {
		return p.s.Wait(ctx, p.keys(keys), timeout)
	})
}

// MultiSet implements Store.
func (p *Prefix) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if err := p.check("multi-set"); err != nil {
		return err
	}
	return p.s.MultiSet(ctx, p.keys(keys), values)
}

// MultiGet implements Store.
func (p *Prefix) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	var vs [][]byte
	err := p.blocking(ctx, "multi-get", func(ctx context.Context) (err error) {
		vs, err = p.s.MultiGet(ctx, p.keys(keys))
		return err
	})
	return vs, err
}

// Append implements Store.
func (p *Prefix) Append(ctx context.Context, key string, value []byte) error {
	if err := p.check("append"); err != nil {
		return err
	}
	return p.s.Append(ctx, p.key(key), value)
}

// Close marks this view closed and releases calls blocked in it with
// ErrClosed; the underlying store stays open.
func (p *Prefix) Close() error {
	p.closed.Store(true)
	p.cancel()
	return nil
}
