package elastic

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/errs"
)

// Defaults of Config.
const (
	// DefaultLastCall is how long a round waits for more members once it
	// has the minimum and not everyone it expects.
	DefaultLastCall = 500 * time.Millisecond
	// DefaultJoinTimeout bounds how long a member waits for a round to
	// reach the minimum size.
	DefaultJoinTimeout = 5 * time.Minute
	// DefaultPeerTimeout is how long a member may be silent inside a
	// collective before its peers count it as lost (the process group's
	// heartbeat timeout; heartbeats go every third of it).
	DefaultPeerTimeout = time.Second
	// DefaultConnectTimeout bounds building a round's process group: a
	// member that joined the round and died before connecting costs this
	// long, then the survivors form the next round.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultWatchInterval is how often a member looks for newcomers
	// waiting to join and checks its round's links.
	DefaultWatchInterval = 100 * time.Millisecond
)

// Config describes a member of an elastic job.
type Config struct {
	// Job names the job: its keys in the store live under "elastic/<Job>/",
	// so several jobs can share one store. Default "default".
	Job string
	// ID names this member in logs and rounds; default host-pid-random.
	// It must be unique among the job's live members.
	ID string
	// MinSize is the fewest members a round may have (default 1); MaxSize
	// the most (0: no limit). Members beyond MaxSize wait for a place.
	MinSize, MaxSize int
	// Batch is the rule that sets each round's per-rank batch and learning
	// rate scale from its size (required).
	Batch BatchRule
	// LastCall, JoinTimeout, PeerTimeout, ConnectTimeout and
	// WatchInterval: see the Default constants.
	LastCall, JoinTimeout, PeerTimeout, ConnectTimeout, WatchInterval time.Duration
	// InitOptions are added to every round's comm.Init (a backend, a
	// token; the rank, world size, store and peer timeout are set here).
	InitOptions []comm.InitOption
	// Logger receives a line per round at INFO and the faults at WARN;
	// default slog.Default().
	Logger *slog.Logger
}

// resolve fills defaults and checks the values.
func (c Config) resolve() (Config, error) {
	if c.Job == "" {
		c.Job = "default"
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		rand.Read(b[:])
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if c.MinSize == 0 {
		c.MinSize = 1
	}
	switch {
	case c.MinSize < 1:
		return c, fmt.Errorf("%w: elastic: MinSize %d: a round needs at least one member", errs.InvalidArgument, c.MinSize)
	case c.MaxSize != 0 && c.MaxSize < c.MinSize:
		return c, fmt.Errorf("%w: elastic: MaxSize %d is below MinSize %d", errs.InvalidArgument, c.MaxSize, c.MinSize)
	case c.Batch == nil:
		return c, fmt.Errorf("%w: elastic: Config.Batch is nil; say how the batch follows the world's size: FixedGlobalBatch(n), PerRankBatch(n) or PerRankBatchScaleLR(n, base)", errs.InvalidArgument)
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.LastCall, DefaultLastCall}, {&c.JoinTimeout, DefaultJoinTimeout}, {&c.PeerTimeout, DefaultPeerTimeout},
		{&c.ConnectTimeout, DefaultConnectTimeout}, {&c.WatchInterval, DefaultWatchInterval}} {
		if *d.v < 0 {
			return c, fmt.Errorf("%w: elastic: negative duration %v in Config", errs.InvalidArgument, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
