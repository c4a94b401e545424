package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
)

func init() { comm.Register("local", Backend{}) }

// Backend is the "local" backend: Connect joins the ranks of one world that
// run as goroutines of this process and share cfg.Store. Rank 0 creates the
// world and publishes its id under the key "local/world" of the store; use a
// fresh store (or prefix) per world.
type Backend struct{}

// storeKey is where rank 0 publishes the world's id.
const storeKey = "local/world"

// worlds is the registry of in-process worlds being joined, by id.
var worlds = struct {
	sync.Mutex
	m map[string]*joining
}{m: map[string]*joining{}}

type joining struct {
	h      *hub
	joined int
}

// Connect returns rank cfg.Rank's transport once the world exists (every
// rank's Connect can then proceed without waiting for the others).
func (Backend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	if err := errs.CheckContext(ctx, "local", "connect"); err != nil {
		return nil, err
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("local backend: rank %d of world size %d: %w", cfg.Rank, cfg.Size, transport.ErrInvalidArgument)
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("local backend: Config.Store is nil; ranks meet through a store: %w", transport.ErrInvalidArgument)
	}
	if _, ok := ctx.Deadline(); !ok && cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	var id string
	if cfg.Rank == 0 {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		id = hex.EncodeToString(b)
		worlds.Lock()
		worlds.m[id] = &joining{h: newHub(cfg.Size)}
		worlds.Unlock()
		if err := cfg.Store.Set(ctx, storeKey, []byte(id)); err != nil {
			worlds.Lock()
			delete(worlds.m, id)
			worlds.Unlock()
			return nil, fmt.Errorf("local backend: publishing the world: %w", err)
		}
	} else {
		v, err := cfg.Store.Get(ctx, storeKey)
		if err != nil {
			return nil, fmt.Errorf("local backend: rank %d waiting for rank 0 to create the world: %w", cfg.Rank, err)
		}
		id = string(v)
	}
	worlds.Lock()
	defer worlds.Unlock()
	j := worlds.m[id]
	if j == nil {
		return nil, fmt.Errorf("local backend: world %q is not in this process (all ranks of a local world must be goroutines of one process, and each world needs a fresh store): %w", id, transport.ErrInvalidArgument)
	}
	if len(j.h.eps) != cfg.Size {
		return nil, fmt.Errorf("local backend: rank %d says the world has %d ranks, rank 0 said %d: %w", cfg.Rank, cfg.Size, len(j.h.eps), transport.ErrMismatch)
	}
	j.joined++
	if j.joined == cfg.Size {
		delete(worlds.m, id)
	}
	return j.h.eps[cfg.Rank], nil
}

// NewGroups returns the world groups of n goroutine ranks in this process:
// groups[r] is rank r's. Each group must be used from its own goroutine(s),
// as separate processes would.
func NewGroups(ctx context.Context, n int, opts ...comm.Option) ([]*comm.ProcessGroup, error) {
	ts, err := NewTransports(n)
	if err != nil {
		return nil, err
	}
	pgs := make([]*comm.ProcessGroup, n)
	for r, t := range ts {
		if pgs[r], err = comm.NewProcessGroup(ctx, t, opts...); err != nil {
			for _, pg := range pgs[:r] {
				_ = pg.Close()
			}
			return nil, err
		}
	}
	return pgs, nil
}
