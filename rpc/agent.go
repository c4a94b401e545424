package rpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/internal/admit"
	"github.com/tandemml/tandem/launch"
)

// WorkerInfo names one worker of the group: its unique name and its id (its
// rank at Init).
type WorkerInfo struct {
	Name string
	ID   int
}

func (w WorkerInfo) String() string { return fmt.Sprintf("%s (id %d)", w.Name, w.ID) }

// Agent is one worker's end of the RPC group: it serves the functions of its
// registry to the other workers and makes calls to them (Sync, Async,
// rref.Remote). Make one per process with Init or InitFromEnv and end it with
// Shutdown (graceful) or Close (at once). An Agent is safe for concurrent
// use.
type Agent struct {
	self    WorkerInfo
	workers []WorkerInfo
	addrs   []string
	byName  map[string]int
	opts    options
	reg     *Registry
	st      store.Store
	ownSt   store.Store // the TCP store the agent made, closed at shutdown
	token   []byte
	// envToken is the job's TANDEM_TOKEN, the token unless WithToken.
	envToken string
	ln       net.Listener
	gate     *admit.Gate   // connections in their handshake (handshake.go)
	warn     *admit.Warner // warnings about refused connections

	// life runs the goroutines tied to the agent (lifetime.go); its
	// context is the parent of every handler's.
	life *lifetime

	peers []*peerSlot

	mu       sync.Mutex
	state    agentState
	servers  map[*conn]struct{}
	shutdown chan struct{} // closed when Shutdown or Close starts

	clientIC atomic.Pointer[[]ClientInterceptor]
	serverIC atomic.Pointer[[]ServerInterceptor]

	// ext: the state of each installed extension, by name (written only
	// during Init).
	ext map[string]any

	hooksMu    sync.Mutex
	hooks      []ShutdownHook
	closeHooks []CloseHook

	closeOnce sync.Once
	closeErr  error

	m metrics
}

type agentState int

const (
	stateRunning agentState = iota
	stateDraining
	stateClosed
)

// peerSlot holds the outgoing connection to one worker.
type peerSlot struct {
	dialing chan struct{} // one-slot semaphore: one dial at a time
	cur     atomic.Pointer[conn]
}

// ShutdownHook runs at the start of a graceful Shutdown, while the agent
// still serves and before it waits for the group's work, with Shutdown's
// context; an error it returns is reported by Shutdown (which completes
// anyway). rref uses one to release leaked references.
type ShutdownHook func(ctx context.Context) error

// CloseHook runs when the agent closes (Close, or the end of Shutdown),
// before its connections are closed; an error it returns is reported by
// Close or Shutdown. Distributed autograd uses one to drop its contexts.
type CloseHook func() error

// Init starts this process's agent as worker rank of worldSize under name
// (unique in the group) and waits until every worker has joined. Workers
// meet through a store: WithStore, or else a TCP store at MASTER_ADDR:MASTER_PORT
// whose server runs in rank 0. Each worker publishes its name, id and
// address; duplicate names fail Init on every worker with an error naming
// them. The context bounds the rendezvous (DefaultTimeout when it has no
// deadline). The extensions given with WithExtensions are installed after
// the rendezvous, before the agent serves its first call.
func Init(ctx context.Context, name string, rank, worldSize int, opts ...Option) (*Agent, error) {
	o := newOptions(opts)
	if worldSize <= 0 || rank < 0 || rank >= worldSize {
		return nil, fmt.Errorf("%w: rpc: rank %d of world size %d: want 0 <= rank < world size", ErrInvalidArgument, rank, worldSize)
	}
	if name == "" {
		name = "worker" + strconv.Itoa(rank)
	}
	if strings.ContainsAny(name, "\x00\n") || len(name) > maxNameLen {
		return nil, fmt.Errorf("%w: rpc: worker name %q: no NUL or newline, at most %d bytes", ErrInvalidArgument, name, maxNameLen)
	}
	if !o.debugSet {
		dbg, err := launch.DebugFromEnv()
		if err != nil {
			return nil, fmt.Errorf("rpc: init: %w", err)
		}
		o.debug = dbg.Level
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	a := &Agent{
		self:     WorkerInfo{Name: name, ID: rank},
		opts:     o,
		reg:      o.registry,
		servers:  map[*conn]struct{}{},
		shutdown: make(chan struct{}),
		gate:     admit.NewGate(0, 0),
		warn:     admit.NewWarner(o.logger, 0),
		life:     newLifetime(),
		ext:      map[string]any{},
	}
	cics, sics := append([]ClientInterceptor(nil), o.clientIC...), append([]ServerInterceptor(nil), o.serverIC...)
	a.clientIC.Store(&cics)
	a.serverIC.Store(&sics)
	a.m.init()

	exts, err := resolveExtensions(o.extensions)
	if err != nil {
		return nil, err
	}
	j, err := o.jobFor(rank, worldSize)
	if err != nil {
		return nil, err
	}
	a.envToken = j.Token
	if err := a.openStore(ctx, j); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			a.abandon()
		}
	}()
	if err := a.listen(j); err != nil {
		return nil, err
	}
	if err := a.agreeToken(ctx); err != nil {
		return nil, err
	}
	met := time.Now()
	if err := a.rendezvous(ctx, worldSize); err != nil {
		return nil, err
	}
	if o.debug >= launch.DebugInfo {
		names := make([]string, len(a.workers))
		for r, w := range a.workers {
			names[r] = w.Name
		}
		o.logger.Info("rpc: workers met", "worker", a.self.Name, "rank", rank, "world_size", worldSize,
			"workers", names, "took", time.Since(met))
	}
	for _, ext := range exts {
		st, err := ext.Install(a)
		if err != nil {
			return nil, fmt.Errorf("rpc: init: installing extension %q on worker %s: %w", ext.Name(), a.self, err)
		}
		a.ext[ext.Name()] = st
	}
	a.life.goFunc(a.acceptLoop)
	ok = true
	return a, nil
}

// InitFromEnv is Init with this process's place in the job read from the
// environment by package launch, with the same rules as comm.InitFromEnv:
// RANK and WORLD_SIZE as tandem run, torchrun and Kubeflow set them, or
// Open MPI's OMPI_COMM_WORLD_*, PMI's PMI_RANK/PMI_SIZE, Slurm's
// SLURM_PROCID and step sizes, a Kubernetes indexed Job's
// JOB_COMPLETION_INDEX (see the launch package for every variable). Without
// WithStore the workers meet through a TCP store at MASTER_ADDR:MASTER_PORT
// that rank 0 serves; MASTER_ADDR defaults to 127.0.0.1 when every worker
// runs on this machine, to the first host of the step's node list under
// Slurm, and MASTER_PORT to a port derived from the job id under Slurm and
// Open MPI. Under torchrun's static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True) torchrun's agent already serves a
// PyTorch TCPStore there: every worker joins it instead, under torch's
// prefix for the attempt ("/worker/attempt_N", N from
// TORCHELASTIC_RESTART_COUNT). That store cannot check a token: a token set
// for the job (WithToken, TANDEM_TOKEN) still guards the agents'
// connections, and a warning says that the store is open to whoever can
// reach it.
//
// An empty name means "worker<rank>". Errors wrap ErrInvalidArgument and
// name the launcher detected, what is missing and how to set it. In a
// process that also runs a process group, pass the group's store with
// WithStore rather than opening a second one.
func InitFromEnv(ctx context.Context, name string, opts ...Option) (*Agent, error) {
	o := newOptions(opts)
	j, err := launch.Read(os.LookupEnv)
	if err == nil {
		err = j.Resolve(o.store == nil)
	}
	if err != nil {
		if o.store == nil {
			return nil, fmt.Errorf("rpc: %w (or pass rpc.WithStore)", err)
		}
		return nil, fmt.Errorf("rpc: %w", err)
	}
	return Init(ctx, name, j.Rank, j.WorldSize, append(opts[:len(opts):len(opts)], withJob(j))...)
}

// jobFor is the job Init runs in: the one InitFromEnv read, else the
// environment's, with Init's rank and world size, checked and, when the
// agent needs a store of its own, with rank 0's address resolved.
func (o *options) jobFor(rank, world int) (launch.Job, error) {
	j := launch.Job{}
	if o.job != nil {
		j = *o.job
	} else {
		var err error
		// With WithStore only the token and rank 0's host (to pick the
		// listening address) come from the environment: a launcher's
		// variables that do not fit Init's rank and world size are no error.
		if j, err = launch.Read(os.LookupEnv); err != nil && o.store == nil {
			return j, fmt.Errorf("rpc: %w (or pass rpc.WithStore)", err)
		}
	}
	if j.Rank != rank || j.WorldSize != world {
		j.Rank, j.WorldSize = rank, world
		j.Sources.Rank, j.Sources.WorldSize = "rpc.Init's rank", "rpc.Init's world size"
	}
	if o.store != nil {
		return j, nil
	}
	if err := j.Resolve(true); err != nil {
		return j, fmt.Errorf("rpc: %w (or pass rpc.WithStore)", err)
	}
	return j, nil
}

// agentStorePrefix is where torch's workers keep their keys in torchrun's
// agent store during restart attempt n (torch 1.13: a PrefixStore
// "/worker/attempt_N"), as comm does too.
func agentStorePrefix(attempt int) string {
	return "/worker/attempt_" + strconv.Itoa(attempt)
}

func (a *Agent) openStore(ctx context.Context, j launch.Job) error {
	if a.opts.store != nil {
		a.st = a.opts.store
		return nil
	}
	if j.WorldSize == 1 && j.MasterPort == 0 {
		// A world of one that was given no store meets nobody.
		s := store.NewMemory()
		a.st, a.ownSt = s, s
		return nil
	}
	addr := j.MasterHostPort()
	if j.AgentStore {
		if a.opts.tokenSet && a.opts.token != "" || !a.opts.tokenSet && j.Token != "" {
			a.opts.logger.Warn("rpc: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) speaks PyTorch's TCPStore protocol, which cannot check "+TokenEnv+
				": the token still guards the connections between workers, but anyone who can reach the store can read and change the rendezvous; "+
				"run under `torchrun --rdzv_backend c10d` or `tandem run` for a store that checks it",
				"store", addr)
		}
		c, err := torchstore.Dial(ctx, addr, torchstore.CountIn(), torchstore.WithTimeout(a.opts.timeout), torchstore.WithLogger(a.opts.logger))
		if err != nil {
			return fmt.Errorf("rpc: worker %d (detected torchrun) could not reach torchrun's agent store at MASTER_ADDR:MASTER_PORT = %s: %w "+
				"(torchrun's agent serves it while TORCHELASTIC_USE_AGENT_STORE=True: start the program with torchrun, or unset TORCHELASTIC_USE_AGENT_STORE to serve Tandem's own store at MASTER_PORT)",
				j.Rank, addr, err)
		}
		a.st = store.NewPrefix(agentStorePrefix(j.RestartCount), c)
		a.ownSt = &closeBoth{Store: a.st, under: c}
		return nil
	}
	sopts := []store.Option{store.WithTimeout(a.opts.timeout), store.WithLogger(a.opts.logger)}
	if a.opts.tokenSet {
		sopts = append(sopts, store.WithToken(a.opts.token))
	}
	s, err := store.NewTCP(ctx, addr, j.Rank == 0, sopts...)
	if err != nil {
		if j.Rank == 0 {
			return fmt.Errorf("rpc: worker 0 (detected %s) could not serve the store at MASTER_ADDR:MASTER_PORT = %s: %w (is the port taken? give the job another MASTER_PORT, or pass rpc.WithStore)",
				j.Launcher, addr, err)
		}
		return fmt.Errorf("rpc: worker %d (detected %s) could not reach worker 0's store at MASTER_ADDR:MASTER_PORT = %s: %w (is worker 0 running, with the same MASTER_ADDR and MASTER_PORT?)",
			j.Rank, j.Launcher, addr, err)
	}
	a.st, a.ownSt = s, s
	return nil
}

// closeBoth is a prefix view that closes the store under it with itself.
type closeBoth struct {
	store.Store
	under store.Store
}

func (c *closeBoth) Close() error { return errors.Join(c.Store.Close(), c.under.Close()) }

// abandon releases what a failed Init had opened.
func (a *Agent) abandon() {
	a.life.stop()
	if a.ln != nil {
		a.ln.Close()
	}
	if a.ownSt != nil {
		a.ownSt.Close()
	}
}

func (a *Agent) listen(j launch.Job) error {
	addr := a.opts.listenAddr
	if addr == "" {
		addr = net.JoinHostPort(defaultHost(j), "0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("rpc: listen on %s: %w", addr, err)
	}
	a.ln = ln
	return nil
}

// defaultHost is the local address that reaches rank 0's host (the job's
// MASTER_ADDR), or loopback.
func defaultHost(j launch.Job) string {
	m := j.MasterAddr
	if m == "" || m == "localhost" {
		return "127.0.0.1"
	}
	if ip := net.ParseIP(m); ip != nil && ip.IsLoopback() {
		return "127.0.0.1"
	}
	port := 29500
	if j.MasterPort > 0 {
		port = j.MasterPort
	}
	c, err := net.Dial("udp", net.JoinHostPort(m, strconv.Itoa(port))) // sends nothing
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

func (a *Agent) advertised() string {
	host, port, _ := net.SplitHostPort(a.ln.Addr().String())
	if a.opts.advertiseHost != "" {
		host = a.opts.advertiseHost
	} else if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

func (a *Agent) key(k string) string { return a.opts.storePrefix + k }

// agreeToken settles the shared token: WithToken, TANDEM_TOKEN, or one
// random token created through the store by whichever worker asks first.
func (a *Agent) agreeToken(ctx context.Context) error {
	tok := a.opts.token
	if !a.opts.tokenSet {
		tok = a.envToken
	}
	if tok == "" {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("rpc: generating a token: %w", err)
		}
		mine := []byte(hex.EncodeToString(b[:]))
		cur, err := a.st.CompareSet(ctx, a.key("token"), nil, mine)
		if err != nil {
			return fmt.Errorf("rpc: agreeing on a token through the store: %w", err)
		}
		tok = string(cur)
	}
	a.token = []byte(tok)
	return nil
}

// rendezvous publishes this worker and learns every other one.
func (a *Agent) rendezvous(ctx context.Context, world int) error {
	me := a.self.Name + "\x00" + a.advertised()
	if err := a.st.Set(ctx, a.key("worker/"+strconv.Itoa(a.self.ID)), []byte(me)); err != nil {
		return fmt.Errorf("rpc: publishing worker %s: %w", a.self, err)
	}
	keys := make([]string, world)
	for r := range keys {
		keys[r] = a.key("worker/" + strconv.Itoa(r))
	}
	vals, err := a.st.MultiGet(ctx, keys)
	if err != nil {
		var missing []string
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		for r, k := range keys {
			if ok, cerr := a.st.Check(cctx, []string{k}); cerr == nil && !ok {
				missing = append(missing, strconv.Itoa(r))
			}
		}
		cancel()
		if len(missing) > 0 {
			return fmt.Errorf("rpc: worker %s waiting for ranks %s of %d to join: %w", a.self, strings.Join(missing, ", "), world, err)
		}
		return fmt.Errorf("rpc: worker %s reading the group from the store: %w", a.self, err)
	}
	a.workers = make([]WorkerInfo, world)
	a.addrs = make([]string, world)
	a.byName = make(map[string]int, world)
	dups := map[string][]int{}
	for r, v := range vals {
		name, addr, ok := strings.Cut(string(v), "\x00")
		if !ok {
			return fmt.Errorf("%w: rpc: store key %s holds %q, not a worker record (another program using prefix %q?)", ErrMismatch, keys[r], v, a.opts.storePrefix)
		}
		a.workers[r] = WorkerInfo{Name: name, ID: r}
		a.addrs[r] = addr
		if prev, ok := a.byName[name]; ok {
			if len(dups[name]) == 0 {
				dups[name] = append(dups[name], prev)
			}
			dups[name] = append(dups[name], r)
		}
		a.byName[name] = r
	}
	if len(dups) > 0 {
		var parts []string
		for n, ids := range dups {
			parts = append(parts, fmt.Sprintf("%q is used by ranks %v", n, ids))
		}
		sort.Strings(parts)
		return fmt.Errorf("%w: rpc: worker names must be unique: %s; give every worker its own name", ErrInvalidArgument, strings.Join(parts, "; "))
	}
	a.peers = make([]*peerSlot, world)
	for i := range a.peers {
		a.peers[i] = &peerSlot{dialing: make(chan struct{}, 1)}
	}
	return nil
}

// Self returns this worker.
func (a *Agent) Self() WorkerInfo { return a.self }

// Workers returns every worker of the group, by id.
func (a *Agent) Workers() []WorkerInfo { return append([]WorkerInfo(nil), a.workers...) }

// WorkerInfo returns the worker called name.
func (a *Agent) WorkerInfo(name string) (WorkerInfo, error) {
	id, ok := a.byName[name]
	if !ok {
		names := make([]string, len(a.workers))
		for i, w := range a.workers {
			names[i] = w.Name
		}
		msg := fmt.Sprintf("rpc: no worker named %q; workers: %s", name, strings.Join(names, ", "))
		if s := suggest(name, names); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(quoteAll(s), " or "))
		}
		return WorkerInfo{}, fmt.Errorf("%w: %s", ErrInvalidArgument, msg)
	}
	return a.workers[id], nil
}

// WorkerByID returns the worker with the given id.
func (a *Agent) WorkerByID(id int) (WorkerInfo, error) {
	if id < 0 || id >= len(a.workers) {
		return WorkerInfo{}, fmt.Errorf("%w: rpc: no worker with id %d (the group has ids 0 to %d)", ErrInvalidArgument, id, len(a.workers)-1)
	}
	return a.workers[id], nil
}

// Registry returns the registry the agent serves.
func (a *Agent) Registry() *Registry { return a.reg }

func (a *Agent) rpcRegistry() *Registry { return a.reg }

// Store returns the store the workers met through.
func (a *Agent) Store() store.Store { return a.st }

// Logger returns the agent's logger.
func (a *Agent) Logger() *slog.Logger { return a.opts.logger }

// DefaultTimeout returns the agent's default call timeout.
func (a *Agent) DefaultTimeout() time.Duration { return a.opts.timeout }

// UseClient adds client interceptors to a running agent (innermost of those
// already there).
func (a *Agent) UseClient(ics ...ClientInterceptor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := *a.clientIC.Load()
	next := append(append([]ClientInterceptor(nil), cur...), ics...)
	a.clientIC.Store(&next)
}

// UseServer adds server interceptors to a running agent (innermost of those
// already there).
func (a *Agent) UseServer(ics ...ServerInterceptor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := *a.serverIC.Load()
	next := append(append([]ServerInterceptor(nil), cur...), ics...)
	a.serverIC.Store(&next)
}

// Extension returns the state that the extension called name installed on
// the agent (what its Install returned), and whether the agent has it:
// packages built on rpc keep their per-agent state there (rref its
// reference tables) and find out whether they were asked for.
func (a *Agent) Extension(name string) (any, bool) {
	st, ok := a.ext[name]
	return st, ok
}

// OnShutdown adds a hook that a graceful Shutdown runs first.
func (a *Agent) OnShutdown(h ShutdownHook) {
	a.hooksMu.Lock()
	a.hooks = append(a.hooks, h)
	a.hooksMu.Unlock()
}

// OnClose adds a hook that runs when the agent closes (Close, or the end
// of Shutdown), before its connections are closed.
func (a *Agent) OnClose(h CloseHook) {
	a.hooksMu.Lock()
	a.closeHooks = append(a.closeHooks, h)
	a.hooksMu.Unlock()
}

// Go runs fn on a goroutine tied to the agent's lifetime, for background
// work of packages built on rpc (rref's releases): a graceful Shutdown
// waits for it as outstanding work, like a call in flight (a call it makes
// is counted by itself too); ctx is cancelled when the agent closes (Close,
// or the end of Shutdown), and closing waits for fn to return. Go reports
// false, without running fn, once the agent has closed.
func (a *Agent) Go(fn func(ctx context.Context)) bool {
	release := a.hold()
	started := a.life.goFunc(func(ctx context.Context) {
		defer release()
		fn(ctx)
	})
	if !started {
		release()
	}
	return started
}

// hold marks work as outstanding until release is called, so that a
// graceful shutdown waits for it. release may be called more than once.
func (a *Agent) hold() (release func()) {
	a.m.held.Add(1)
	var once sync.Once
	return func() { once.Do(func() { a.m.held.Add(-1) }) }
}

// ShuttingDown returns a channel closed when Shutdown or Close starts.
func (a *Agent) ShuttingDown() <-chan struct{} { return a.shutdown }

// running reports whether the agent still accepts calls.
func (a *Agent) running() error {
	a.mu.Lock()
	s := a.state
	a.mu.Unlock()
	if s == stateClosed {
		return fmt.Errorf("this agent, %s, is shut down: %w", a.self, ErrClosed)
	}
	return nil
}

var errAgentClosed = errors.New("agent shut down")
