//go:build linux

package shm

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/liveness"
)

// DefaultMaxMessage bounds one message when transport.Config.MaxMessage is 0.
const DefaultMaxMessage int64 = 1 << 30

// DefaultPeerTimeout is how long a peer's heartbeat word may stay unchanged
// before the peer counts as unresponsive, when transport.Config.PeerTimeout
// does not say otherwise.
const DefaultPeerTimeout = liveness.Timeout

// Ring sizes: each ordered pair of ranks gets one ring. The default is
// ringBudget shared among the pairs, kept between minRing and maxRing.
const (
	maxRing    = 4 << 20
	minRing    = 256 << 10
	ringBudget = 256 << 20
)

// Store keys, all under the backend's own prefix.
const (
	keySegment = "shm/segment"
	// segmentPrefix starts every segment file's name.
	segmentPrefix = "tandem-shm-"
)

const defaultConnectTimeout = 5 * time.Minute

// Backend builds shared-memory transports for ranks that all run on one
// host. The zero value is ready to use.
type Backend struct {
	dir     string
	ringCap int
	spin    time.Duration
	spinSet bool // spin was configured (else spinFor)
}

// Option configures a Backend.
type Option func(*Backend)

// WithDir places the segment file in dir instead of /dev/shm. The directory
// should be a memory file system (tmpfs); any other makes every message go
// through the page cache.
func WithDir(dir string) Option { return func(b *Backend) { b.dir = dir } }

// WithRingBytes sets the capacity of each pair's ring in bytes, rounded up
// to a multiple of 4096 and at least 8192. Larger rings let a sender run
// further ahead of its receiver; messages larger than the ring are streamed
// through it.
func WithRingBytes(n int) Option { return func(b *Backend) { b.ringCap = n } }

// WithSpin sets how long a wait on a ring polls it before sleeping on a
// futex: 50 µs by default, 0 (or less) to sleep at once, say where the
// ranks share their cores with other busy processes. Between looks a poll
// yields to the rank's other goroutines and to the other threads on its CPU
// (futex.Yield), so ranks that outnumber the CPUs poll too: four ranks on
// two cores ran an all-reduce of 4 KiB through the rings in 1.1-1.3 ms
// polling against 2.0 sleeping at once, and one of 16 MiB in 17.5-20.7 ms
// against 22-24 (tandem bench allreduce -no-staging -nproc 4).
func WithSpin(d time.Duration) Option {
	d = max(d, 0)
	return func(b *Backend) { b.spin, b.spinSet = d, true }
}

// NewBackend returns a Backend configured by opts.
func NewBackend(opts ...Option) Backend {
	var b Backend
	for _, o := range opts {
		o(&b)
	}
	return b
}

func (b Backend) ringBytes(world int) int {
	if b.ringCap > 0 {
		return max(2*pageSize, roundUp(b.ringCap, pageSize))
	}
	pairs := max(1, world*(world-1))
	c := maxRing
	for c > minRing && c*pairs > ringBudget {
		c /= 2
	}
	return c
}

// SegmentBytes returns the size of the segment that a world of the given
// size maps: what its directory (/dev/shm unless WithDir) must have free.
func (b Backend) SegmentBytes(world int) int64 {
	if world <= 1 {
		return 0
	}
	return int64(segmentSize(world, b.ringBytes(world)))
}

// FreeBytes returns how many bytes the segment's directory (/dev/shm unless
// WithDir) has free for this user.
func (b Backend) FreeBytes() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(b.directory(), &st); err != nil {
		return 0, fmt.Errorf("shm: reading the free space of %s: %w", b.directory(), err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

func (b Backend) directory() string {
	if b.dir == "" {
		return "/dev/shm"
	}
	return b.dir
}

// Connect maps the world's shared segment and returns this rank's
// transport. Rank 0 creates the segment and publishes its name through
// cfg.Store; every rank maps it, and once all have, the file's name is
// removed, so nothing is left in /dev/shm once the ranks exit. Connect
// returns when every rank has mapped it, or fails when the context ends or
// cfg.Timeout (5 minutes when zero) passes.
func (b Backend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	return transport.Upcast(b.connect(ctx, cfg))
}

// ConnectSHM is Connect returning the concrete type.
func (b Backend) ConnectSHM(ctx context.Context, cfg transport.Config) (*Transport, error) {
	return b.connect(ctx, cfg)
}

func (b Backend) connect(ctx context.Context, cfg transport.Config) (*Transport, error) {
	if err := errs.CheckContext(ctx, "shm", "connect"); err != nil {
		return nil, err
	}
	// 1024 ranks: as many as one host can share a segment among.
	if err := cfg.Validate("shm", 1024); err != nil {
		return nil, err
	}
	maxMsg := cfg.MaxMessage
	if maxMsg == 0 {
		maxMsg = DefaultMaxMessage
	}
	live := liveness.Config{Timeout: cfg.PeerTimeout}.Resolve()
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	dir := b.directory()
	world := cfg.Size
	var seg *segment
	var err error
	var path string
	if world == 1 {
		// Only messages to itself: no segment needed beyond the header.
		seg = &segment{world: 1}
	} else if cfg.Rank == 0 {
		seg, path, err = createSegment(dir, world, b.ringBytes(world), cfg.Token)
		if err != nil {
			return nil, err
		}
		if err := cfg.Store.Set(cctx, keySegment, []byte(path)); err != nil {
			seg.unmap()
			os.Remove(path)
			return nil, fmt.Errorf("shm: connect: publishing the segment's name: %w", err)
		}
	} else {
		v, err := cfg.Store.Get(cctx, keySegment)
		if err != nil {
			return nil, fmt.Errorf("shm: connect: rank %d waiting for rank 0's segment name: %w", cfg.Rank, err)
		}
		path = string(v)
		if seg, err = openSegment(path, world, cfg.Token); err != nil {
			return nil, err
		}
	}
	spin := spinFor
	if b.spinSet {
		spin = b.spin
	}
	t := newTransport(cfg.Rank, world, maxMsg, live, seg, spin)
	if world == 1 {
		return t, nil
	}
	t.attach()
	err = t.waitAttached(cctx)
	if err == nil {
		// Every rank holds a mapping: the name is no longer needed. Each
		// rank removes it, so that it is gone whichever returns first.
		os.Remove(path)
	}
	if err != nil {
		if cfg.Rank == 0 {
			os.Remove(path)
		}
		t.Abort(err)
		t.Close()
		return nil, err
	}
	t.start()
	return t, nil
}

// waitAttached waits until every rank has mapped the segment.
func (t *Transport) waitAttached(ctx context.Context) error {
	d := 100 * time.Microsecond
	for {
		var missing []int
		for r := range t.size {
			if t.seg.u64(t.seg.rank(r)+rkState).Load() == stateAbsent {
				missing = append(missing, r)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			s := ""
			for i, r := range missing {
				if i > 0 {
					s += ","
				}
				s += strconv.Itoa(r)
			}
			return errs.FromContext(ctx, fmt.Sprintf("shm: connect: rank %d: ranks %s never mapped the shared segment (are they on this host?)", t.rank, s))
		case <-time.After(d):
		}
		d = min(2*d, 20*time.Millisecond)
	}
}
