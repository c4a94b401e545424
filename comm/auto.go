package comm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
)

// BackendEnv names the environment variable that picks Init's backend when
// WithBackend is not given: "auto" (the default), "tcp", "shm" or any other
// registered name.
const BackendEnv = "TANDEM_BACKEND"

// AutoBackend is the name of the backend that looks at where the ranks run
// and connects each world the fastest way it can (see WithBackend):
//
//   - every rank on this host: shared memory (comm/shm);
//   - one rank per host: TCP (comm/tcp);
//   - several hosts with several ranks on some: both, shared memory between
//     the ranks of one host and TCP between hosts, and all-reduce runs
//     hierarchically (reduce inside each host into its first rank, all-reduce
//     between those leaders over TCP, broadcast inside each host).
//
// Ranks count as being on one host when they share the kernel's boot id and
// their network, mount and PID namespaces, so that processes in separate
// containers of one machine count as separate hosts (they may not see one
// /dev/shm or each other's processes); WithHostID overrides the identity. A
// host whose /dev/shm lacks room for the segment makes the whole world use
// TCP, with a warning from rank 0.
const AutoBackend = "auto"

// WithHostID replaces the identity that the automatic backend (AutoBackend)
// uses to tell which ranks share a host: ranks with equal identities talk
// through shared memory, others through TCP. The default reads the boot id
// and the network, mount and PID namespaces from /proc. Ranks given one
// identity must run on one machine, in one mount and PID namespace.
// (Different identities on one machine are fine: tests use them to play
// several hosts.)
func WithHostID(id string) InitOption { return func(c *initConfig) { c.hostID = id } }

// backendName resolves the backend Init uses: WithBackend, else
// $TANDEM_BACKEND, else DefaultBackend.
func (c *initConfig) backendName() string {
	if c.backend != "" {
		return c.backend
	}
	if v, ok := c.lookup(BackendEnv); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return DefaultBackend
}

// autoBackend is AutoBackend: it chooses shm, tcp or both from the host
// identities that the ranks publish in the store.
type autoBackend struct {
	tcp    transport.Backend
	shm    shm.Backend
	hostID string       // "" reads this host's identity
	logger *slog.Logger // nil: slog.Default()
}

// keyHostBase is where each rank publishes its hostFacts, under the
// backend's store view.
const keyHostBase = "auto/host/"

// hostFacts is what a rank tells the others about where it runs.
type hostFacts struct {
	ID      string `json:"id"`
	ShmFree int64  `json:"shm_free"` // bytes free in the segment's directory; -1 when unusable
}

// localHostID identifies this host and the namespaces that decide whether
// two processes can share memory through /dev/shm and see each other's
// process ids. It returns "" where /proc does not tell (not Linux): every
// such rank then counts as a host of its own.
func localHostID() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	parts := []string{strings.TrimSpace(string(boot))}
	for _, ns := range []string{"net", "mnt", "pid"} {
		l, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			return ""
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, " ")
}

// hostPlan is the layout the ranks agreed on: every rank computes it from
// the same published facts, so every rank reaches the same plan.
type hostPlan struct {
	kind    string  // "shm", "tcp" or "hier"
	why     string  // for the log
	noRoom  bool    // ranks share a host, but its /dev/shm is too small
	host    []int   // host index of every rank; hosts numbered by their lowest rank
	members [][]int // ranks of every host, ascending
}

// planHosts groups the ranks by their identity and chooses the transport.
func planHosts(facts []hostFacts, sb shm.Backend) hostPlan {
	p := hostPlan{host: make([]int, len(facts))}
	index := map[string]int{}
	for r, f := range facts {
		h, ok := index[f.ID]
		if !ok || f.ID == "" {
			h = len(p.members)
			p.members = append(p.members, nil)
			if f.ID != "" {
				index[f.ID] = h
			}
		}
		p.host[r] = h
		p.members[h] = append(p.members[h], r)
	}
	shared := 0 // hosts with more than one rank
	for _, m := range p.members {
		if len(m) > 1 {
			need := sb.SegmentBytes(len(m))
			if free := facts[m[0]].ShmFree; free < need {
				p.kind, p.noRoom = "tcp", true
				p.why = fmt.Sprintf("the shared-memory segment for rank %d's host needs %d bytes in /dev/shm, which has %d free; "+
					"give it more room (docker run --shm-size) for the faster transport, or set %s=tcp to silence this", m[0], need, free, BackendEnv)
				return p
			}
			shared++
		}
	}
	switch {
	case len(p.members) == 1:
		p.kind, p.why = "shm", "every rank runs on this host"
	case shared == 0:
		p.kind, p.why = "tcp", "every rank runs on a host of its own"
	default:
		p.kind, p.why = "hier", fmt.Sprintf("%d hosts, %d of them with several ranks: shared memory inside a host, TCP between hosts", len(p.members), shared)
	}
	return p
}

// Connect publishes where this rank runs, reads where the others do, and
// connects the transport the plan names.
func (b autoBackend) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("comm: auto backend: rank %d of world size %d: %w", cfg.Rank, cfg.Size, ErrInvalidArgument)
	}
	tb := b.tcp
	if tb == nil {
		tb = tcp.Backend{}
	}
	if cfg.Size == 1 {
		return b.shm.Connect(ctx, cfg)
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("comm: auto backend: a world of %d ranks needs a rendezvous store in transport.Config.Store: %w", cfg.Size, ErrInvalidArgument)
	}
	f := hostFacts{ID: b.hostID, ShmFree: -1}
	if f.ID == "" {
		f.ID = localHostID()
	}
	if free, err := b.shm.FreeBytes(); err == nil {
		f.ShmFree = free
	}
	v, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("comm: auto backend: %w", err)
	}
	if err := cfg.Store.Set(ctx, keyHostBase+strconv.Itoa(cfg.Rank), v); err != nil {
		return nil, fmt.Errorf("comm: auto backend: rank %d publishing its host: %w", cfg.Rank, err)
	}
	keys := rankKeys(keyHostBase, cfg.Size)
	if err := cfg.Store.Wait(ctx, keys, cfg.Timeout); err != nil {
		return nil, fmt.Errorf("comm: auto backend: rank %d waiting for the other ranks' hosts: %w", cfg.Rank, err)
	}
	vals, err := cfg.Store.MultiGet(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("comm: auto backend: rank %d reading the other ranks' hosts: %w", cfg.Rank, err)
	}
	facts := make([]hostFacts, cfg.Size)
	for r, v := range vals {
		if err := json.NewDecoder(bytes.NewReader(v)).Decode(&facts[r]); err != nil {
			return nil, fmt.Errorf("comm: auto backend: rank %d published %q as its host, which is not what this version writes; run one Tandem version on every rank: %w",
				r, v, ErrMismatch)
		}
	}
	plan := planHosts(facts, b.shm)
	logger := b.logger
	if logger == nil {
		logger = slog.Default()
	}
	if cfg.Rank == 0 {
		if plan.noRoom {
			logger.Warn("comm: init: ranks share a host, but they connect over TCP: "+plan.why, "hosts", len(plan.members))
		} else {
			logger.Debug("comm: init: automatic backend", "backend", plan.kind, "why", plan.why, "hosts", len(plan.members))
		}
	}
	switch plan.kind {
	case "shm":
		return b.shm.Connect(ctx, cfg)
	case "tcp":
		return tb.Connect(ctx, cfg)
	}
	return connectHier(ctx, cfg, plan, tb, b.shm)
}

// autoFor returns the automatic backend over the TCP backend tb, for Init.
func autoFor(tb transport.Backend, cfg *initConfig) autoBackend {
	return autoBackend{tcp: tb, hostID: cfg.hostID, logger: cfg.logger()}
}

// hostStore is the view of the store where the ranks of host h meet for
// their shared-memory segment.
func hostStore(st store.Store, h int) store.Store {
	return store.NewPrefix("auto/shm/"+strconv.Itoa(h), st)
}
