package comm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

// The TCP backend is built in: comm imports comm/tcp (which imports neither
// comm nor anything above comm/transport and comm/store) and registers it
// here, so InitFromEnv works without a blank import. Other backends
// (comm/local, later shared memory or MPI) import comm and register
// themselves by name from their own init.
func init() {
	Register("tcp", tcp.Backend{})
	Register(AutoBackend, autoBackend{})
}

// DefaultBackend is the backend Init uses when neither WithBackend nor
// $TANDEM_BACKEND (BackendEnv) names one: AutoBackend, shared memory
// between ranks of one host, TCP between hosts.
const DefaultBackend = AutoBackend

// TokenEnv names the environment variable holding the job's shared secret,
// the default of WithToken: launch.TokenEnv.
const TokenEnv = launch.TokenEnv

// InitOption configures Init and InitFromEnv.
type InitOption func(*initConfig)

type initConfig struct {
	rank, world int // -1: not given
	backend     string
	timeout     time.Duration
	peerTimeout time.Duration
	token       string
	tokenSet    bool
	st          store.Store
	storeOpts   []store.Option
	groupOpts   []Option
	noDefault   bool
	lookup      func(string) (string, bool) // the environment; os.LookupEnv unless a test says otherwise
	hostID      string                      // WithHostID
}

// WithRank sets this process's rank, overriding RANK (and its fallbacks).
func WithRank(rank int) InitOption { return func(c *initConfig) { c.rank = rank } }

// WithWorldSize sets the number of processes, overriding WORLD_SIZE.
func WithWorldSize(n int) InitOption { return func(c *initConfig) { c.world = n } }

// WithBackend picks the registered backend by name: "auto" (AutoBackend,
// the default: shared memory between the ranks of one host, TCP between
// hosts), "tcp", "shm" (every rank on one host), "local" for goroutine
// ranks once comm/local is imported. It overrides $TANDEM_BACKEND
// (BackendEnv), which overrides the default. To use the TCP backend on one
// network of a machine with several, register a configured copy, e.g.
// comm.Register("tcp-ib", tcp.NewBackend(tcp.WithHost("10.1.0.5"))) and
// pass WithBackend("tcp-ib").
func WithBackend(name string) InitOption { return func(c *initConfig) { c.backend = name } }

// WithInitTimeout bounds the whole initialisation (store, rendezvous,
// connection set-up) when ctx has no earlier deadline, and becomes the
// group's default operation timeout unless WithGroupOptions passes
// WithTimeout. Default: DefaultTimeout. (The name differs from WithTimeout,
// the group option, because Go has no overloading.)
func WithInitTimeout(d time.Duration) InitOption {
	return func(c *initConfig) {
		if d > 0 {
			c.timeout = d
		}
	}
}

// WithPeerTimeout sets how long a peer may stay silent (no data, no
// heartbeat) before the backend counts it as unresponsive and the group
// aborts, with errors that name the peer and say since when it has been
// silent. The default is the backend's: 5 s for the built-in TCP backend,
// whose idle links carry a heartbeat every second, so a frozen (stopped,
// swapped out) or unreachable rank stops the job within seconds instead
// of at the end of the operation's timeout. d < 0 turns the check off;
// d = 0 keeps the default. Raise it on links that lose packets heavily or
// stall for seconds; every rank should use the same value (a rank that
// checks more often asks its peers for heartbeats often enough, so
// differing values still work). It reaches the backend as
// transport.Config.PeerTimeout.
func WithPeerTimeout(d time.Duration) InitOption {
	return func(c *initConfig) { c.peerTimeout = d }
}

// WithToken sets the shared secret that the store and every connection
// demand (default: $TANDEM_TOKEN; empty means no secret). Every rank must
// use the same one.
func WithToken(token string) InitOption {
	return func(c *initConfig) { c.token, c.tokenSet = token, true }
}

// WithStore makes the ranks rendezvous through st instead of a store named by
// the URL or MASTER_ADDR/MASTER_PORT. The caller keeps ownership of st and
// closes it after the group. A store serves one world: give concurrent
// worlds separate stores or store.NewPrefix views.
func WithStore(st store.Store) InitOption { return func(c *initConfig) { c.st = st } }

// WithStoreOptions adds options to the store Init opens itself (not one
// given with WithStore), after its token and timeout: for example
// store.WithObserver to measure its operations.
func WithStoreOptions(opts ...store.Option) InitOption {
	return func(c *initConfig) { c.storeOpts = append(c.storeOpts, opts...) }
}

// WithGroupOptions passes options to NewProcessGroup.
func WithGroupOptions(opts ...Option) InitOption {
	return func(c *initConfig) { c.groupOpts = append(c.groupOpts, opts...) }
}

// WithoutDefault keeps Init from installing the new group as the default
// group (see Default) when none is installed yet.
func WithoutDefault() InitOption { return func(c *initConfig) { c.noDefault = true } }

// withLookupEnv replaces the environment (tests).
func withLookupEnv(f func(string) (string, bool)) InitOption {
	return func(c *initConfig) { c.lookup = f }
}

// InitFromEnv is Init(ctx, "env://", opts...): it reads this process's
// place in the job through package launch (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT as tandem run, torchrun and Kubeflow set them, or the
// variables of Open MPI, PMI, Slurm and Kubernetes indexed Jobs; see
// EnvFromOS and the launch package), rendezvous with the other ranks through
// the TCP store that rank 0 serves at MASTER_ADDR:MASTER_PORT, connects the
// backend and returns the world group. Its errors name the launcher that
// launch detected and how to supply what is missing under it.
//
// Under torchrun's static rendezvous, its default, torchrun's agent already
// serves a PyTorch TCPStore at MASTER_ADDR:MASTER_PORT and says so with
// TORCHELASTIC_USE_AGENT_STORE=True. Then no rank binds the port: every rank
// dials the agent's store (comm/store/torchstore, counted in as torch's
// workers are) and meets under torch's own prefix for the attempt,
// "/worker/attempt_N" with N from TORCHELASTIC_RESTART_COUNT, so that a
// restarted job starts from empty keys. Waiting there polls (torch 1.13's
// server does not wake a WAIT when COMPARE_SET creates the key). The
// PyTorch protocol carries no token: a token given for the job
// (WithToken, TANDEM_TOKEN) still guards the connections between ranks, and
// Init logs one warning that the store itself is open to whoever can reach
// it (to the group's WithLogger, else slog.Default()). torchrun
// --rdzv_backend c10d or --standalone leaves MASTER_PORT free
// (TORCHELASTIC_USE_AGENT_STORE=False), and rank 0 serves Tandem's own
// store there, which checks the token.
//
// Elastic `tandem run -rdzv-endpoint` does the same with Tandem's own store:
// MASTER_ADDR:MASTER_PORT is the rendezvous store that `tandem store` serves
// for the launchers, and TANDEM_STORE_PREFIX (launch.Job.StorePrefix) names
// the rendezvous round's key prefix. Every rank then dials that store (with
// the token) and meets under the prefix, so that each round starts from
// empty keys and no rank serves a store.
func InitFromEnv(ctx context.Context, opts ...InitOption) (*ProcessGroup, error) {
	return Init(ctx, "env://", opts...)
}

// Init joins this process to a world and returns its world process group.
// The URL says where the ranks meet:
//
//	env://                                     MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
//	tcp://HOST:PORT?rank=R&world_size=N        rank 0 serves a TCP store at HOST:PORT, the others dial it
//	file:///PATH?rank=R&world_size=N           a file store at PATH, on a file system every rank shares
//
// Rank and world size come from WithRank and WithWorldSize, else the URL's
// query, else the environment; giving one twice with different values is an
// error. Init then claims this rank in the store (two processes with one
// rank fail on the second), checks that every rank agrees on the world size,
// waits for all ranks (naming those that never arrive), connects the
// backend (WithBackend, else $TANDEM_BACKEND, else "auto": shared memory
// when every rank runs on this host, TCP between hosts, see AutoBackend)
// and returns the group. Everything is bounded by ctx and WithInitTimeout.
// Unless WithoutDefault is given, the first group Init returns in a process
// also becomes the default group.
//
// The group owns the store that Init created (not one passed with WithStore)
// and closes it with itself. With file://, the last rank to close its group
// deletes the file, so that the next run starts from an empty store.
//
// Every rank runs on this machine when the store's address is a loopback
// address; the built-in TCP backend then listens on 127.0.0.1 only.
// Otherwise it listens on every interface and offers each of its addresses
// to its peers (see comm/tcp.WithHost to pin one).
func Init(ctx context.Context, rawURL string, opts ...InitOption) (*ProcessGroup, error) {
	if err := errs.CheckContext(ctx, "comm", "init"); err != nil {
		return nil, err
	}
	cfg := initConfig{rank: -1, world: -1, timeout: DefaultTimeout, lookup: os.LookupEnv}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	cfg.backend = cfg.backendName()
	if !cfg.tokenSet {
		cfg.token, _ = cfg.lookup(TokenEnv)
	}
	plan, err := planInit(rawURL, &cfg)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}
	backend, err := plan.backendFor(&cfg)
	if err != nil {
		return nil, err
	}

	st, owned, err := plan.openStore(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	closeStore := func() {
		if owned {
			st.Close()
		}
	}
	ns := store.NewPrefix("tandem", st)
	r := rendezvous{st: ns, rank: plan.env.Rank, world: plan.env.WorldSize, where: plan.where, timeout: cfg.timeout}
	if plan.scheme == "file" {
		r.staleHint = fmt.Sprintf("; if %s is left over from an earlier run, delete it", plan.filePath)
	}
	tr, err := r.run(ctx, func(ctx context.Context) (transport.Transport, error) {
		tr, err := backend.Connect(ctx, transport.Config{
			Rank: plan.env.Rank, Size: plan.env.WorldSize, Store: ns, Timeout: cfg.timeout, Token: cfg.token,
			PeerTimeout: cfg.peerTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("comm: init: rank %d connecting backend %q: %w", plan.env.Rank, cfg.backend, err)
		}
		return tr, nil
	}, plan.servesStore())
	if err != nil {
		ns.Close()
		closeStore()
		return nil, err
	}
	var closers []func() error
	if plan.scheme == "file" {
		closers = append(closers, func() error { return removeWhenLast(ns, plan.filePath, plan.env.WorldSize) })
	}
	closers = append(closers, ns.Close)
	if owned {
		closers = append(closers, st.Close)
	}
	groupOpts := append([]Option{WithTimeout(cfg.timeout)}, cfg.groupOpts...)
	pg, err := NewProcessGroup(ctx, &owningTransport{Transport: tr, closers: closers}, groupOpts...)
	if err != nil {
		tr.Close()
		ns.Close()
		closeStore()
		return nil, err
	}
	r.logMet(pg)
	if !cfg.noDefault {
		defaultGroup.CompareAndSwap(nil, pg)
	}
	return pg, nil
}

// initPlan is what Init resolved from its URL, options and environment.
type initPlan struct {
	env       Env
	scheme    string // "env", "tcp", "file"; "" for a world of one without a store
	storeAddr string // tcp: host:port of rank 0's store
	filePath  string // file: the store's path
	where     string // the store, for error messages
	// agentStore: torchrun's agent already serves a PyTorch TCPStore at
	// storeAddr (TORCHELASTIC_USE_AGENT_STORE=True); every rank dials it
	// and meets under torch's prefix for this attempt, agentPrefix.
	agentStore  bool
	agentPrefix string
	// roundPrefix: elastic tandem run's store, served by `tandem store` at
	// storeAddr (TANDEM_STORE_PREFIX); every rank dials it and meets under
	// this prefix.
	roundPrefix string
	launcher    launch.Launcher
}

func planInit(rawURL string, cfg *initConfig) (*initPlan, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("comm: init URL %q: %v; use env://, tcp://HOST:PORT?rank=R&world_size=N or file:///PATH?rank=R&world_size=N: %w",
			rawURL, err, ErrInvalidArgument)
	}
	found, err := readEnv(cfg.lookup)
	if err != nil {
		return nil, fmt.Errorf("comm: init: %w", err)
	}
	p := &initPlan{scheme: u.Scheme}
	switch u.Scheme {
	case "env":
		if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("comm: init URL %q: env:// takes no address or parameters; the environment supplies them: %w",
				rawURL, ErrInvalidArgument)
		}
	case "tcp", "file":
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return nil, fmt.Errorf("comm: init URL %q: bad query: %v: %w", rawURL, err, ErrInvalidArgument)
		}
		for k := range q {
			if k != "rank" && k != "world_size" {
				return nil, fmt.Errorf("comm: init URL %q: unknown parameter %q (known: rank, world_size): %w", rawURL, k, ErrInvalidArgument)
			}
		}
		for _, v := range []struct {
			key  string
			dst  *int
			name string
		}{{"rank", &found.Rank, "rank"}, {"world_size", &found.WorldSize, "world_size"}} {
			if s := q.Get(v.key); s != "" {
				x, err := strconv.Atoi(s)
				if err != nil || x < 0 {
					return nil, fmt.Errorf("comm: init URL %q: %s=%q is not a non-negative integer: %w", rawURL, v.key, s, ErrInvalidArgument)
				}
				*v.dst = x
				if v.key == "rank" {
					found.rankVar = "the URL's rank"
				} else {
					found.worldVar = "the URL's world_size"
				}
			}
		}
		if u.Scheme == "tcp" {
			host, port, err := net.SplitHostPort(u.Host)
			if err != nil || host == "" {
				return nil, fmt.Errorf("comm: init URL %q: want tcp://HOST:PORT?rank=R&world_size=N: %w", rawURL, ErrInvalidArgument)
			}
			n, err := strconv.Atoi(port)
			if err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("comm: init URL %q: port %q is not a port number (1..65535): %w", rawURL, port, ErrInvalidArgument)
			}
			found.MasterAddr, found.MasterPort, found.portVar = host, n, "the URL"
			p.storeAddr = u.Host
			p.where = "the TCP store at " + u.Host
		} else {
			if u.Host != "" && u.Host != "localhost" {
				return nil, fmt.Errorf("comm: init URL %q: a file store needs a local path: file:///PATH (three slashes): %w", rawURL, ErrInvalidArgument)
			}
			if u.Path == "" {
				return nil, fmt.Errorf("comm: init URL %q: no path; use file:///PATH?rank=R&world_size=N: %w", rawURL, ErrInvalidArgument)
			}
			p.filePath = u.Path
			p.where = "the file store " + u.Path
		}
	case "":
		return nil, fmt.Errorf("comm: init URL %q has no scheme; use env://, tcp://HOST:PORT?rank=R&world_size=N or file:///PATH?rank=R&world_size=N: %w",
			rawURL, ErrInvalidArgument)
	default:
		return nil, fmt.Errorf("comm: init URL %q: unknown scheme %q; use env://, tcp:// or file://: %w", rawURL, u.Scheme, ErrInvalidArgument)
	}
	if cfg.rank >= 0 {
		if found.rankVar != "" && strings.HasPrefix(found.rankVar, "the URL") && found.Rank != cfg.rank {
			return nil, fmt.Errorf("comm: init: rank given twice: rank=%d in the URL and WithRank(%d): %w", found.Rank, cfg.rank, ErrInvalidArgument)
		}
		found.Rank, found.rankVar = cfg.rank, "comm.WithRank"
	} else if cfg.rank < -1 {
		return nil, fmt.Errorf("comm: init: WithRank(%d): ranks are not negative: %w", cfg.rank, ErrInvalidArgument)
	}
	if cfg.world >= 0 {
		if found.worldVar != "" && strings.HasPrefix(found.worldVar, "the URL") && found.WorldSize != cfg.world {
			return nil, fmt.Errorf("comm: init: world size given twice: world_size=%d in the URL and WithWorldSize(%d): %w", found.WorldSize, cfg.world, ErrInvalidArgument)
		}
		found.WorldSize, found.worldVar = cfg.world, "comm.WithWorldSize"
	} else if cfg.world < -1 {
		return nil, fmt.Errorf("comm: init: WithWorldSize(%d): must be at least 1: %w", cfg.world, ErrInvalidArgument)
	}
	if cfg.st != nil {
		if u.Scheme != "env" {
			return nil, fmt.Errorf("comm: init: WithStore and the URL %q both name a store; use env:// with WithStore: %w", rawURL, ErrInvalidArgument)
		}
		p.scheme = "store"
		p.where = "the given store"
	}
	// Only env:// finds its store through MASTER_ADDR and MASTER_PORT.
	if err := found.complete(p.scheme == "env"); err != nil {
		return nil, fmt.Errorf("comm: init: %w", err)
	}
	p.env = found.Env
	p.launcher = found.job.Launcher
	if p.scheme == "env" {
		switch {
		case found.WorldSize == 1 && found.MasterPort == 0:
			p.scheme = "" // nothing to meet: a private in-memory store
			p.where = "an in-memory store"
		case found.job.AgentStore:
			p.agentStore = true
			p.agentPrefix = agentStorePrefix(found.job.RestartCount)
			p.storeAddr = found.MasterHostPort()
			p.where = fmt.Sprintf("torchrun's agent store at MASTER_ADDR:MASTER_PORT = %s", p.storeAddr)
		case found.job.StorePrefix != "":
			p.roundPrefix = found.job.StorePrefix
			p.storeAddr = found.MasterHostPort()
			p.where = fmt.Sprintf("the rendezvous store at MASTER_ADDR:MASTER_PORT = %s under %s", p.storeAddr, p.roundPrefix)
		default:
			p.storeAddr = found.MasterHostPort()
			p.where = fmt.Sprintf("the TCP store at MASTER_ADDR:MASTER_PORT = %s", p.storeAddr)
		}
	}
	return p, nil
}

// agentStorePrefix is where torch's own workers keep their keys in
// torchrun's agent store during restart attempt n (torch 1.13's
// _create_c10d_store: a PrefixStore "/worker/attempt_N"), so that a
// restarted job starts from an empty namespace.
func agentStorePrefix(attempt int) string {
	return "/worker/attempt_" + strconv.Itoa(attempt)
}

// dialAgentStore joins torchrun's agent store at addr as torch's workers do
// (a TCPStore client counted in with the world size), under the attempt's
// prefix. The store speaks PyTorch's protocol, which carries no token: a
// token given for the job still guards the backend's connections, and
// logger says that the store is not guarded.
func dialAgentStore(ctx context.Context, addr, prefix string, rank int, token string, timeout time.Duration, logger *slog.Logger) (store.Store, error) {
	if token != "" {
		logger.Warn("comm: init: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) speaks PyTorch's TCPStore protocol, which cannot check "+TokenEnv+
			": the token still guards the connections between ranks, but anyone who can reach the store can read and change the rendezvous; "+
			"run under `torchrun --rdzv_backend c10d` or `tandem run` for a store that checks it",
			"store", addr)
	}
	c, err := torchstore.Dial(ctx, addr, torchstore.CountIn(), torchstore.WithTimeout(timeout), torchstore.WithLogger(logger))
	if err != nil {
		return nil, fmt.Errorf("comm: init: rank %d (detected torchrun) could not reach torchrun's agent store at MASTER_ADDR:MASTER_PORT = %s: %w "+
			"(torchrun's agent serves it while TORCHELASTIC_USE_AGENT_STORE=True: start the program with torchrun, or unset TORCHELASTIC_USE_AGENT_STORE to serve Tandem's own store at MASTER_PORT)",
			rank, addr, err)
	}
	return &agentStoreView{Store: store.NewPrefix(prefix, c), under: c, timeout: timeout}, nil
}

// dialRoundStore joins the rendezvous store of elastic `tandem run` at addr
// (served by `tandem store`) as a client, under the round's prefix.
func dialRoundStore(ctx context.Context, addr, prefix string, rank int, sopts []store.Option) (store.Store, error) {
	c, err := store.NewTCP(ctx, addr, false, sopts...)
	if err != nil {
		return nil, fmt.Errorf("comm: init: rank %d (detected tandem run, %s=%s) could not reach the rendezvous store at MASTER_ADDR:MASTER_PORT = %s: %w "+
			"(`tandem store` serves it for `tandem run -rdzv-endpoint`: is it running, with the job's token?)",
			rank, launch.StorePrefixEnv, prefix, addr, err)
	}
	return &roundStoreView{Store: store.NewPrefix(prefix, c), under: c}, nil
}

// roundStoreView is a round's prefix of the rendezvous store, closing the
// client under it with itself.
type roundStoreView struct {
	store.Store
	under store.Store
}

// Close closes the view and the client under it.
func (v *roundStoreView) Close() error { return errors.Join(v.Store.Close(), v.under.Close()) }

// agentStoreView is the attempt's prefix of torchrun's agent store, closing
// the client under it with itself. torch 1.13's TCPStore server wakes the
// clients waiting for a key when SET or ADD creates it, but not when
// COMPARE_SET does, and the rendezvous claims ranks with CompareSet: a WAIT
// (and a GET, which waits first) for a key that does not exist yet could
// sleep through its creation until its timeout. So the view waits by polling
// CHECK, every 5 ms at first and every 100 ms at most, and only then asks
// the server, when the keys exist and its WAIT returns at once.
type agentStoreView struct {
	store.Store
	under   store.Store
	timeout time.Duration // the default of Wait's zero timeout
}

// Close closes the view and the client under it.
func (v *agentStoreView) Close() error { return errors.Join(v.Store.Close(), v.under.Close()) }

// Wait implements store.Store by polling Check.
func (v *agentStoreView) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = v.timeout
	}
	return v.until(ctx, keys, timeout)
}

// Get implements store.Store: it waits for key by polling, then reads it.
func (v *agentStoreView) Get(ctx context.Context, key string) ([]byte, error) {
	if err := v.until(ctx, []string{key}, v.timeout); err != nil {
		return nil, err
	}
	return v.Store.Get(ctx, key)
}

// MultiGet implements store.Store: it waits for keys by polling, then reads
// them.
func (v *agentStoreView) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	if err := v.until(ctx, keys, v.timeout); err != nil {
		return nil, err
	}
	return v.Store.MultiGet(ctx, keys)
}

// until polls Check until every key exists, ctx ends or timeout passes.
func (v *agentStoreView) until(ctx context.Context, keys []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for {
		ok, err := v.Store.Check(ctx, keys)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("comm: wait for keys %q in torchrun's agent store: not set within %v: %w", keys, timeout, store.ErrTimeout)
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return errs.FromContext(ctx, fmt.Sprintf("comm: wait for keys %q in torchrun's agent store", keys))
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// servesStore reports whether this rank runs the TCP store server that the
// others depend on (under torchrun's agent store, none does).
func (p *initPlan) servesStore() bool {
	return p.env.Rank == 0 && !p.agentStore && p.roundPrefix == "" && (p.scheme == "env" || p.scheme == "tcp")
}

// masterIsLoopback reports whether the store lives on this machine's loopback,
// which means that every rank runs here.
func (p *initPlan) masterIsLoopback() bool {
	if p.scheme != "env" && p.scheme != "tcp" {
		return false
	}
	h := p.env.MasterAddr
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// backendFor resolves the backend name. When every rank runs on this machine
// (the store is on loopback), the built-in TCP backend stays on loopback too,
// alone or under the automatic backend.
func (p *initPlan) backendFor(cfg *initConfig) (transport.Backend, error) {
	var tb transport.Backend = tcp.Backend{}
	if p.masterIsLoopback() {
		tb = tcp.NewBackend(tcp.WithHost("127.0.0.1"))
	}
	switch cfg.backend {
	case "tcp":
		return tb, nil
	case AutoBackend:
		return autoFor(tb, cfg), nil
	}
	b, err := Lookup(cfg.backend)
	if err != nil {
		return nil, fmt.Errorf("comm: init: %w", err)
	}
	return b, nil
}

// openStore returns the rendezvous store and whether Init owns it.
func (p *initPlan) openStore(ctx context.Context, cfg *initConfig) (store.Store, bool, error) {
	sopts := append([]store.Option{store.WithToken(cfg.token), store.WithTimeout(cfg.timeout)}, cfg.storeOpts...)
	switch p.scheme {
	case "store":
		return cfg.st, false, nil
	case "":
		return store.NewMemory(sopts...), true, nil
	case "env":
		if p.agentStore {
			st, err := dialAgentStore(ctx, p.storeAddr, p.agentPrefix, p.env.Rank, cfg.token, cfg.timeout, cfg.logger())
			return st, err == nil, err
		}
		if p.roundPrefix != "" {
			st, err := dialRoundStore(ctx, p.storeAddr, p.roundPrefix, p.env.Rank, sopts)
			return st, err == nil, err
		}
	case "file":
		st, err := store.NewFile(p.filePath, sopts...)
		if err != nil {
			return nil, false, fmt.Errorf("comm: init: rank %d opening the file store %s (every rank needs the same path, on a file system they share): %w",
				p.env.Rank, p.filePath, err)
		}
		return st, true, nil
	}
	if p.env.Rank == 0 {
		listen := p.storeAddr
		if !p.masterIsLoopback() {
			// MASTER_ADDR names this machine as the others see it; listen on
			// every interface so that it need not resolve to a local one.
			listen = net.JoinHostPort("", strconv.Itoa(p.env.MasterPort))
		}
		st, err := store.NewTCP(ctx, listen, true, sopts...)
		if err != nil {
			return nil, false, fmt.Errorf("comm: init: rank 0 (detected %s) could not serve the store at %s: %w (is the port taken by another job? %s)",
				p.launcher, listen, err, p.portAdvice())
		}
		return st, true, nil
	}
	st, err := store.NewTCP(ctx, p.storeAddr, false, sopts...)
	if err != nil {
		return nil, false, fmt.Errorf("comm: init: rank %d (detected %s) could not reach rank 0's store at %s: %w (is rank 0 running, with the same MASTER_ADDR and MASTER_PORT?)",
			p.env.Rank, p.launcher, p.storeAddr, err)
	}
	return st, true, nil
}

// portAdvice says how to move rank 0's store to another port under the
// detected launcher.
func (p *initPlan) portAdvice() string {
	if p.scheme == "tcp" {
		return "pick another port in the URL"
	}
	switch p.launcher {
	case launch.TandemRun:
		return "pass another port with `tandem run -master HOST:PORT`, or leave -master out on a single node for a free one"
	case launch.Torchrun:
		return "pass another `torchrun --master_port PORT`"
	case launch.OpenMPI:
		return "pass another one to every rank: `mpirun -x MASTER_PORT=PORT ...`"
	case launch.PMI:
		return "pass another one to every rank: `mpiexec -genv MASTER_PORT PORT ...`"
	case launch.Slurm:
		return "export another MASTER_PORT before srun (the derived one collides with another job on rank 0's node)"
	}
	return "set MASTER_PORT to a free port, the same on every rank"
}

// logger is where Init reports what it does not fail on: the group's logger
// (WithGroupOptions(WithLogger(l))), else slog.Default().
func (c *initConfig) logger() *slog.Logger {
	var o options
	for _, opt := range c.groupOpts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.logger == nil {
		return slog.Default()
	}
	return o.logger
}

// owningTransport closes the stores Init opened once the group closes its
// transport.
type owningTransport struct {
	transport.Transport
	closers []func() error
}

// OneHost passes on the backend's transport.OneHost.
func (o *owningTransport) OneHost() bool {
	oh, ok := o.Transport.(transport.OneHost)
	return ok && oh.OneHost()
}

// PeerError passes on the backend's account of a failed link (see
// peerErrors).
func (o *owningTransport) PeerError(rank int) error {
	if pe, ok := o.Transport.(peerErrors); ok {
		return pe.PeerError(rank)
	}
	return nil
}

func (o *owningTransport) Close() error {
	err := o.Transport.Close()
	for _, c := range o.closers {
		err = errors.Join(err, c())
	}
	return err
}

// removeWhenLast counts this rank out of a file store's job and deletes the
// file when it is the last rank to leave, as c10d's FileStore does, so that
// the next run starts from an empty store.
func removeWhenLast(st store.Store, path string, world int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := st.Add(ctx, "done", 1)
	if err != nil {
		return fmt.Errorf("comm: counting this rank out of the file store %s: %w", path, err)
	}
	if n == int64(world) {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("comm: removing the file store %s after the last rank left: %w", path, err)
		}
	}
	return nil
}
