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
	"github.com/tandemml/tandem/internal/admit"
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
// Shutdown. An Agent is safe for concurrent use.
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
	ln      net.Listener
	gate    *admit.Gate   // connections in their handshake (handshake.go)
	warn    *admit.Warner // warnings about refused connections

	baseCtx    context.Context
	cancelBase context.CancelFunc

	peers []*peerSlot

	mu       sync.Mutex
	state    agentState
	servers  map[*conn]struct{}
	shutdown chan struct{} // closed when Shutdown starts

	clientIC atomic.Pointer[[]ClientInterceptor]
	serverIC atomic.Pointer[[]ServerInterceptor]

	ext     sync.Map
	hooksMu sync.Mutex
	hooks   []ShutdownHook

	m  metrics
	wg sync.WaitGroup // accept loop, handshakes, read loops
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

// ShutdownHook runs at the start of Shutdown, before the agent stops
// serving; an error it returns is reported by Shutdown (which completes
// anyway). rref uses one to release and report leaked references.
type ShutdownHook func(ctx context.Context, graceful bool) error

// Init starts this process's agent as worker rank of worldSize under name
// (unique in the group) and waits until every worker has joined. Workers
// meet through a store: WithStore, or else a TCP store at MASTER_ADDR:MASTER_PORT
// whose server runs in rank 0. Each worker publishes its name, id and
// address; duplicate names fail Init on every worker with an error naming
// them. The context bounds the rendezvous (DefaultTimeout when it has no
// deadline).
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
	}
	a.baseCtx, a.cancelBase = context.WithCancel(context.Background())
	cics, sics := append([]ClientInterceptor(nil), o.clientIC...), append([]ServerInterceptor(nil), o.serverIC...)
	a.clientIC.Store(&cics)
	a.serverIC.Store(&sics)
	a.m.init()

	if err := a.openStore(ctx, rank); err != nil {
		a.cancelBase()
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			a.abandon()
		}
	}()
	if err := a.listen(); err != nil {
		return nil, err
	}
	if err := a.agreeToken(ctx); err != nil {
		return nil, err
	}
	if err := a.rendezvous(ctx, worldSize); err != nil {
		return nil, err
	}
	for _, ext := range registeredExtensions() {
		if err := ext.attach(a); err != nil {
			return nil, fmt.Errorf("rpc: extension %s: %w", ext.name, err)
		}
	}
	a.wg.Add(1)
	go a.acceptLoop()
	ok = true
	return a, nil
}

// InitFromEnv is Init with rank and world size from the environment: RANK
// and WORLD_SIZE (else OMPI_COMM_WORLD_RANK/SIZE as mpirun sets them, else
// PMI_RANK/PMI_SIZE, else SLURM_PROCID and SLURM_NTASKS), the variables and
// order comm.EnvFromOS uses. Without WithStore it rendezvouses through a TCP
// store at MASTER_ADDR:MASTER_PORT (rank 0 serves it; MASTER_ADDR defaults to
// 127.0.0.1 when LOCAL_WORLD_SIZE equals WORLD_SIZE). An empty name means
// "worker<rank>". In a process that also runs a process group, pass the
// group's store with WithStore rather than serving a second store on the
// same port.
func InitFromEnv(ctx context.Context, name string, opts ...Option) (*Agent, error) {
	rank, world, err := rankFromEnv()
	if err != nil {
		return nil, err
	}
	return Init(ctx, name, rank, world, opts...)
}

func rankFromEnv() (rank, world int, err error) {
	pairs := [][2]string{{"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}}
	for _, p := range pairs {
		r, w := os.Getenv(p[0]), os.Getenv(p[1])
		if r == "" && w == "" {
			continue
		}
		rank, err1 := strconv.Atoi(r)
		world, err2 := strconv.Atoi(w)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("%w: rpc: %s=%q and %s=%q must be integers", ErrInvalidArgument, p[0], r, p[1], w)
		}
		return rank, world, nil
	}
	return 0, 0, fmt.Errorf("%w: rpc: RANK and WORLD_SIZE are not set (launch with tandem run, torchrun-style variables, mpirun or Slurm, or call Init)", ErrInvalidArgument)
}

func (a *Agent) openStore(ctx context.Context, rank int) error {
	if a.opts.store != nil {
		a.st = a.opts.store
		return nil
	}
	host, port := os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")
	if host == "" && os.Getenv("LOCAL_WORLD_SIZE") != "" && os.Getenv("LOCAL_WORLD_SIZE") == os.Getenv("WORLD_SIZE") {
		host = "127.0.0.1" // every worker runs on this machine
	}
	if host == "" || port == "" {
		return fmt.Errorf("%w: rpc: no store: pass WithStore, or set MASTER_ADDR and MASTER_PORT (tandem run does)", ErrInvalidArgument)
	}
	sopts := []store.Option{store.WithTimeout(a.opts.timeout), store.WithLogger(a.opts.logger)}
	if a.opts.tokenSet {
		sopts = append(sopts, store.WithToken(a.opts.token))
	}
	s, err := store.NewTCP(ctx, net.JoinHostPort(host, port), rank == 0, sopts...)
	if err != nil {
		return fmt.Errorf("rpc: store at %s:%s: %w", host, port, err)
	}
	a.st, a.ownSt = s, s
	return nil
}

// abandon releases what a failed Init had opened.
func (a *Agent) abandon() {
	a.cancelBase()
	if a.ln != nil {
		a.ln.Close()
	}
	if a.ownSt != nil {
		a.ownSt.Close()
	}
}

func (a *Agent) listen() error {
	addr := a.opts.listenAddr
	if addr == "" {
		addr = net.JoinHostPort(defaultHost(), "0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("rpc: listen on %s: %w", addr, err)
	}
	a.ln = ln
	return nil
}

// defaultHost is the local address that reaches MASTER_ADDR, or loopback.
func defaultHost() string {
	m := os.Getenv("MASTER_ADDR")
	if m == "" || m == "localhost" {
		return "127.0.0.1"
	}
	if ip := net.ParseIP(m); ip != nil && ip.IsLoopback() {
		return "127.0.0.1"
	}
	port := os.Getenv("MASTER_PORT")
	if port == "" {
		port = "29500"
	}
	c, err := net.Dial("udp", net.JoinHostPort(m, port)) // sends nothing
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
		tok = os.Getenv(TokenEnv)
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

// Extension returns the value stored under key, creating it with create the
// first time (concurrent first calls create it once). Packages built on rpc
// keep their per-agent state here (rref keeps its reference tables).
func (a *Agent) Extension(key any, create func() any) any {
	if v, ok := a.ext.Load(key); ok {
		return v
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.ext.Load(key); ok {
		return v
	}
	v := create()
	a.ext.Store(key, v)
	return v
}

// OnShutdown adds a hook that Shutdown runs first.
func (a *Agent) OnShutdown(h ShutdownHook) {
	a.hooksMu.Lock()
	a.hooks = append(a.hooks, h)
	a.hooksMu.Unlock()
}

// Hold marks background work as outstanding until release is called, so that
// a graceful shutdown waits for it (a call started from it is counted by
// itself). release may be called more than once.
func (a *Agent) Hold() (release func()) {
	a.m.held.Add(1)
	var once sync.Once
	return func() { once.Do(func() { a.m.held.Add(-1) }) }
}

// ShuttingDown returns a channel closed when Shutdown starts.
func (a *Agent) ShuttingDown() <-chan struct{} { return a.shutdown }

// extension is a package that attaches itself to every agent at Init.
type extension struct {
	name   string
	attach func(*Agent) error
}

var extensions struct {
	mu   sync.Mutex
	list []extension
}

// RegisterExtension makes attach run on every agent that Init starts, after
// the rendezvous and before the agent serves its first call, so that a
// package built on rpc (rref) can install its functions and interceptors on
// every worker that links it in. Call it from an init function.
func RegisterExtension(name string, attach func(*Agent) error) {
	extensions.mu.Lock()
	defer extensions.mu.Unlock()
	for _, e := range extensions.list {
		if e.name == name {
			return
		}
	}
	extensions.list = append(extensions.list, extension{name, attach})
}

func registeredExtensions() []extension {
	extensions.mu.Lock()
	defer extensions.mu.Unlock()
	return append([]extension(nil), extensions.list...)
}

// running reports whether the agent still accepts calls.
func (a *Agent) running() error {
	a.mu.Lock()
	s := a.state
	a.mu.Unlock()
	if s == stateClosed {
		return fmt.Errorf("%w: rpc: agent %s is shut down", ErrClosed, a.self)
	}
	return nil
}

var errAgentClosed = errors.New("agent shut down")
