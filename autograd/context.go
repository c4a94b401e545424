package autograd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// DefaultReleaseTimeout bounds the messages that release a context on the
// other workers when WithContext ends it (End uses its ctx instead).
const DefaultReleaseTimeout = 10 * time.Second

// Context is one worker's part of a distributed autograd context: the
// pieces of the graph recorded on this worker (local functions, and the
// send and receive functions of RPCs that carried tensors), the gradients
// accumulated here, and the workers it exchanged messages with.
//
// The worker that began the context (with Begin or WithContext) owns it: it
// alone runs Backward and End. Other workers get their part when an RPC
// made inside the context reaches them; handlers find it with FromContext.
// A Context is safe for concurrent use, but recording must not race with a
// backward pass of the same context (a pass sees what was recorded when it
// reached this worker).
type Context struct {
	id    ContextID
	m     *manager
	owner bool

	mu       sync.Mutex
	tensors  map[*tensor.Dense]*tinfo
	nodes    []*node
	sends    map[uint64]*node
	peers    map[int]bool // workers this part exchanged messages with
	known    map[int]bool // workers known to take part (learned transitively)
	grads    map[*models.Param]*tensor.Dense
	leaf     map[*tensor.Dense]*tensor.Dense // gradients of RequireGrad leaves
	passes   map[uint64]*pass
	passSeq  uint64
	broken   error // a forward call failed
	lastErr  error // the last failed backward pass
	released bool
}

// ID returns the context's id, the same on every worker.
func (c *Context) ID() ContextID { return c.id }

// Owner reports whether this worker began the context.
func (c *Context) Owner() bool { return c.owner }

// Agent returns the agent the context lives on.
func (c *Context) Agent() *rpc.Agent { return c.m.agent }

// Err returns the error of the last backward pass that failed on this
// worker (nil if none did): a pass aborted because another worker failed
// ends here with an error wrapping ErrAborted.
func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// Workers returns the ids of the workers this worker knows to take part in
// the context (itself included). On the owner, after the forward pass, that
// is every worker the context touched.
func (c *Context) Workers() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return sortedIDs(c.known)
}

func (c *Context) String() string {
	return fmt.Sprintf("autograd context %s on worker %s", c.id, c.m.agent.Self())
}

type ctxKey struct{}

// NewContextWithAutograd returns a copy of ctx that carries c: RPCs made
// with it are recorded in c, and handlers reached by them find their part
// of the context with FromContext. WithContext hands its function such a
// context already.
func NewContextWithAutograd(ctx context.Context, c *Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, c)
}

// FromContext returns the distributed autograd context that ctx carries, or
// nil. Inside a handler reached by an RPC made within a context it is this
// worker's part of that context.
func FromContext(ctx context.Context) *Context {
	c, _ := ctx.Value(ctxKey{}).(*Context)
	return c
}

// detach returns ctx without an autograd context, for the protocol's own
// calls, which must not be recorded.
func detach(ctx context.Context) context.Context {
	if FromContext(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, (*Context)(nil))
}

// Begin starts a new distributed autograd context owned by this worker.
// End it with End (WithContext does both).
func Begin(a *rpc.Agent) (*Context, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: autograd: Begin with a nil agent", ErrInvalidArgument)
	}
	m, err := managerOf(a)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("%w: autograd: agent %s is shut down", ErrClosed, a.Self())
	}
	m.seq++
	c := newContext(m, ContextID(makeID(a.Self().ID, m.seq)), true)
	m.contexts[c.id] = c
	return c, nil
}

func newContext(m *manager, id ContextID, owner bool) *Context {
	self := m.agent.Self().ID
	return &Context{
		id: id, m: m, owner: owner,
		tensors: map[*tensor.Dense]*tinfo{},
		sends:   map[uint64]*node{},
		peers:   map[int]bool{},
		known:   map[int]bool{self: true, id.Worker(): true},
		grads:   map[*models.Param]*tensor.Dense{},
		leaf:    map[*tensor.Dense]*tensor.Dense{},
		passes:  map[uint64]*pass{},
	}
}

// WithContext runs fn inside a new distributed autograd context and ends
// the context afterwards, whether fn succeeded or not: every worker the
// context touched drops its part (with DefaultReleaseTimeout to do so, even
// when ctx has expired). The ctx given to fn carries the context, so RPCs
// made with it are recorded. It returns fn's error, joined with the
// release's if that failed too.
func WithContext(ctx context.Context, a *rpc.Agent, fn func(ctx context.Context, c *Context) error) error {
	c, err := Begin(a)
	if err != nil {
		return err
	}
	ferr := runGuarded(func() error { return fn(NewContextWithAutograd(ctx, c), c) })
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultReleaseTimeout)
	defer cancel()
	return errors.Join(ferr, c.End(rctx))
}

func runGuarded(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("autograd: panic in the context's function: %v", r)
		}
	}()
	return fn()
}

// End ends the context: its part here is dropped and every worker known to
// take part is told to drop its own (in parallel, bounded by ctx; workers
// pass the release on to the workers they talked to, so parts reached only
// through a failed call are found too). Passes still running fail with
// ErrClosed. Only the owner ends a context; ending twice is harmless. The
// error names the workers that could not be reached.
func (c *Context) End(ctx context.Context) error {
	if !c.owner {
		return fmt.Errorf("%w: autograd: End on worker %s of %s, which worker %d owns", ErrInvalidArgument, c.m.agent.Self(), c.id, c.id.Worker())
	}
	targets, first := c.m.drop(c, fmt.Errorf("%w: autograd: context %s ended", ErrClosed, c.id))
	if !first {
		return nil
	}
	return c.m.releaseOn(ctx, c.id, targets)
}

// participants returns the workers other than this one that take part.
func (c *Context) participants() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	self := c.m.agent.Self().ID
	var out []int
	for _, w := range sortedIDs(c.known) {
		if w != self {
			out = append(out, w)
		}
	}
	return out
}

// releaseTargets returns the workers a release must reach: known ones and
// direct peers, without this worker.
func (c *Context) releaseTargetsLocked() []int {
	set := map[int]bool{}
	for w := range c.known {
		set[w] = true
	}
	for w := range c.peers {
		set[w] = true
	}
	delete(set, c.m.agent.Self().ID)
	return sortedIDs(set)
}

func (c *Context) addKnown(ids string) {
	if ids == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range strings.Split(ids, ",") {
		if w, err := strconv.Atoi(s); err == nil && w >= 0 && w < len(c.m.agent.Workers()) {
			c.known[w] = true
		}
	}
}

func (c *Context) knownString() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := sortedIDs(c.known)
	parts := make([]string, len(ids))
	for i, w := range ids {
		parts[i] = strconv.Itoa(w)
	}
	return strings.Join(parts, ",")
}

// poison marks the forward pass as failed.
func (c *Context) poison(err error) {
	c.mu.Lock()
	if c.broken == nil {
		c.broken = err
	}
	c.mu.Unlock()
}

func sortedIDs(set map[int]bool) []int {
	out := make([]int, 0, len(set))
	for w := range set {
		out = append(out, w)
	}
	sort.Ints(out)
	return out
}

// Lookup returns this worker's part of the context id, if it has one (none
// on an agent without distributed autograd).
func Lookup(a *rpc.Agent, id ContextID) (*Context, bool) {
	m, err := managerOf(a)
	if err != nil {
		return nil, false
	}
	c := m.lookup(id)
	return c, c != nil
}

// Contexts returns the ids of the contexts that have a part on this worker,
// sorted (an empty list once every context has ended: tests use it to find
// leaks; none on an agent without distributed autograd).
func Contexts(a *rpc.Agent) []ContextID {
	m, err := managerOf(a)
	if err != nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ContextID, 0, len(m.contexts))
	for id := range m.contexts {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// GetGradients returns copies of the parameter gradients accumulated on
// this worker in context id (PyTorch's dist_autograd.get_gradients). Only
// parameters that received a gradient appear.
func GetGradients(a *rpc.Agent, id ContextID) (map[*models.Param]*tensor.Dense, error) {
	m, err := managerOf(a)
	if err != nil {
		return nil, err
	}
	c := m.lookup(id)
	if c == nil {
		return nil, unknownContext(a, id)
	}
	return c.Gradients(), nil
}

func unknownContext(a *rpc.Agent, id ContextID) error {
	return &unknownContextError{msg: fmt.Sprintf("autograd: worker %s has no part of context %s (it ended, or no RPC of the context reached this worker)", a.Self(), id)}
}
