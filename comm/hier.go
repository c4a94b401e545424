package comm

import (
	"context"
	"errors"
	"fmt"

	"github.com/tandemml/tandem/comm/transport"
)

// hierTransport joins the ranks of several hosts: a shared-memory transport
// among the ranks of this rank's host and a TCP transport across the whole
// world. Every message to a rank of this host goes through shared memory,
// every other one through TCP, so each peer's messages keep one path and
// their order. It tells comm where the ranks run (hostLayout), and
// all-reduce then runs hierarchically (hierAllReduce); every other
// collective runs its usual algorithm over the two paths.
type hierTransport struct {
	rank, size int
	host       []int               // host index of every world rank
	local      []int               // every world rank's index among its host's ranks
	shm        transport.Transport // nil when no other rank runs on this host
	tcp        transport.Transport
}

var _ transport.Transport = (*hierTransport)(nil)

// connectHier connects this rank's two transports: shared memory with the
// other ranks of its host (their own world, met under the host's store
// view), then TCP with every rank.
func connectHier(ctx context.Context, cfg transport.Config, plan hostPlan, tb, sb transport.Backend) (transport.Transport, error) {
	h := &hierTransport{rank: cfg.Rank, size: cfg.Size, host: plan.host, local: make([]int, cfg.Size)}
	for _, m := range plan.members {
		for i, r := range m {
			h.local[r] = i
		}
	}
	mine := plan.members[plan.host[cfg.Rank]]
	if len(mine) > 1 {
		st := hostStore(cfg.Store, plan.host[cfg.Rank])
		scfg := cfg
		scfg.Rank, scfg.Size, scfg.Store = h.local[cfg.Rank], len(mine), st
		t, err := sb.Connect(ctx, scfg)
		st.Close() // the segment is mapped: the view is no longer needed
		if err != nil {
			return nil, fmt.Errorf("comm: rank %d connecting shared memory with the %d ranks of its host (world ranks %v): %w", cfg.Rank, len(mine), mine, err)
		}
		h.shm = t
	}
	t, err := tb.Connect(ctx, cfg)
	if err != nil {
		if h.shm != nil {
			h.shm.Abort(err)
			h.shm.Close()
		}
		return nil, fmt.Errorf("comm: rank %d connecting TCP between hosts: %w", cfg.Rank, err)
	}
	h.tcp = t
	return h, nil
}

// Rank returns this rank.
func (h *hierTransport) Rank() int { return h.rank }

// Size returns the world size.
func (h *hierTransport) Size() int { return h.size }

// hostLayout returns the host index of every world rank.
func (h *hierTransport) hostLayout() []int { return h.host }

// route returns the transport that carries messages to world rank peer and
// the peer's rank in it.
func (h *hierTransport) route(peer int) (transport.Transport, int, bool) {
	if h.shm != nil && peer >= 0 && peer < h.size && h.host[peer] == h.host[h.rank] {
		return h.shm, h.local[peer], true
	}
	return h.tcp, peer, false
}

// shmErr says which world rank a shared-memory error's host-local ranks are.
func (h *hierTransport) shmErr(peer int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("over shared memory, whose ranks count this host's ranks (world rank %d is %d there, world rank %d is %d): %w",
		h.rank, h.local[h.rank], peer, h.local[peer], err)
}

// Send sends buf to peer under tag over the peer's path.
func (h *hierTransport) Send(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	t, p, viaShm := h.route(peer)
	err := t.Send(ctx, p, tag, buf)
	if viaShm {
		return h.shmErr(peer, err)
	}
	return err
}

// Recv receives the next message from peer under tag over the peer's path.
func (h *hierTransport) Recv(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	t, p, viaShm := h.route(peer)
	err := t.Recv(ctx, p, tag, buf)
	if viaShm {
		return h.shmErr(peer, err)
	}
	return err
}

// RecvReduce receives the next message from peer under tag and combines it
// into dst: straight out of the shared segment for a rank of this host,
// through a scratch buffer for the others.
func (h *hierTransport) RecvReduce(ctx context.Context, peer int, tag transport.Tag, dst []byte, reduce func(dst, src []byte)) error {
	t, p, viaShm := h.route(peer)
	if rr, ok := t.(reduceReceiver); ok {
		err := rr.RecvReduce(ctx, p, tag, dst, reduce)
		if viaShm {
			return h.shmErr(peer, err)
		}
		return err
	}
	return recvThenReduce(ctx, t, p, tag, dst, reduce)
}

// recvThenReduce is RecvReduce for a transport without it.
func recvThenReduce(ctx context.Context, t transport.Transport, peer int, tag transport.Tag, dst []byte, reduce func(dst, src []byte)) error {
	s := getScratch(len(dst))
	defer putScratch(s)
	if err := t.Recv(ctx, peer, tag, *s); err != nil {
		return err
	}
	reduce(dst, *s)
	return nil
}

// PeerError returns why the path to world rank peer failed, or nil.
func (h *hierTransport) PeerError(peer int) error {
	t, p, _ := h.route(peer)
	if pe, ok := t.(peerErrors); ok {
		return pe.PeerError(p)
	}
	return nil
}

// Abort aborts both paths: every peer, on this host or another, sees this
// rank gone.
func (h *hierTransport) Abort(cause error) {
	if h.shm != nil {
		h.shm.Abort(cause)
	}
	h.tcp.Abort(cause)
}

// Close closes both paths.
func (h *hierTransport) Close() error {
	var err error
	if h.shm != nil {
		err = h.shm.Close()
	}
	return errors.Join(err, h.tcp.Close())
}

// hostLayouts is implemented by transports whose ranks run on several
// hosts: hostLayout returns the host index of every world rank.
type hostLayouts interface {
	hostLayout() []int
}

// unwrap returns the backend's transport under Init's owningTransport.
func unwrap(t transport.Transport) transport.Transport {
	if o, ok := t.(*owningTransport); ok {
		return o.Transport
	}
	return t
}

// reduceReceiverOf returns t's RecvReduce, or nil when it has none.
func reduceReceiverOf(t transport.Transport) reduceReceiver {
	rr, _ := unwrap(t).(reduceReceiver)
	return rr
}

// Steps of the hierarchical all-reduce's phases inside a host. The phase
// between hosts is an ordinary ring (stepRing) or recursive doubling among
// the hosts' leaders, and the broadcast inside a host an ordinary tree
// (stepTree); those tags are shared with no other message of the same pair
// of ranks, since the leaders' messages cross hosts and the others do not.
const stepHostReduce = 0x100

// hostViews returns, when the group's members run on several hosts and
// some host has several of them, two views of c: local, the members on this
// rank's host (its rank 0, the host's first member, is the leader), and
// leaders, the first member of every host (nil unless this rank is one).
// It returns ok false when the group is better served by the flat
// algorithms.
func (c *opCtx) hostViews() (local, leaders *opCtx, ok bool) {
	hosts := func() []int {
		if l, ok := unwrap(c.pg.world.t).(hostLayouts); ok {
			return l.hostLayout()
		}
		return nil
	}()
	if hosts == nil {
		return nil, nil, false
	}
	byHost := map[int][]int{} // host -> world ranks of the group's members there, in group order
	var heads []int           // world rank of each host's first member, in group order
	for _, wr := range c.pg.members {
		h := hosts[wr]
		if len(byHost[h]) == 0 {
			heads = append(heads, wr)
		}
		byHost[h] = append(byHost[h], wr)
	}
	if len(heads) < 2 || len(heads) == len(c.pg.members) {
		return nil, nil, false
	}
	me := c.pg.members[c.pg.rank]
	mine := byHost[hosts[me]]
	local = c.view(mine, indexOf(mine, me))
	if mine[0] == me {
		leaders = c.view(heads, indexOf(heads, me))
	}
	return local, leaders, true
}

func indexOf(s []int, x int) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// view is c restricted to members (world ranks), this rank being rank: the
// same group id and sequence number, so the view's messages are tagged as
// the collective's own.
func (c *opCtx) view(members []int, rank int) *opCtx {
	pg := &ProcessGroup{world: c.pg.world, id: c.pg.id, name: c.pg.name, opts: c.pg.opts, rank: rank, members: members}
	return &opCtx{pg: pg, seq: c.seq}
}

// hierAllReduce all-reduces b in place across hosts: the ranks of each
// host reduce into their leader along a binomial tree over shared memory,
// the leaders all-reduce among themselves (ring or recursive doubling, as
// the flat all-reduce would choose for their number) over TCP, and each
// leader broadcasts the result to its host along a tree. Only one copy of
// the buffer's traffic per host crosses the network, instead of one per
// rank. Each element is reduced along one chain and then copied, so every
// rank ends with the same bits. finalize runs once on the leaders' result.
func hierAllReduce(ctx context.Context, local, leaders *opCtx, b []byte, dt dtype, k ReduceKind, finalize func([]byte)) error {
	if local.size() > 1 {
		if err := hostReduce(ctx, local, b, dt, k); err != nil {
			return fmt.Errorf("reducing inside this host: %w", err)
		}
	}
	if leaders != nil {
		n := leaders.size()
		var err error
		if len(b) < leaders.pg.opts.ringThreshold || len(b)/dt.size() < n {
			err = recursiveDoubling(ctx, leaders, b, dt, k, finalize)
		} else {
			err = ringRun(ctx, leaders, splitEven(b, dt.size(), n), dt, k, 0, 2*(n-1), finalize)
		}
		if err != nil {
			return fmt.Errorf("all-reducing between hosts: %w", err)
		}
	}
	if local.size() > 1 {
		if err := broadcastTree(ctx, local, b, dt, 0); err != nil {
			return fmt.Errorf("broadcasting inside this host: %w", err)
		}
	}
	return nil
}

// hostReduce reduces every local rank's b into local rank 0's b along a
// binomial tree, chunk by chunk, each chunk combined straight out of the
// transport where it offers RecvReduce. A non-root rank's b is left
// partly reduced: the broadcast that follows overwrites it.
func hostReduce(ctx context.Context, c *opCtx, b []byte, dt dtype, k ReduceKind) error {
	parent, children := treeLinks(c.size(), c.rank(), 0)
	// Smallest subtree first: its sum is ready soonest.
	for i, j := 0, len(children)-1; i < j; i, j = i+1, j-1 {
		children[i], children[j] = children[j], children[i]
	}
	chunk := c.chunkBytes(dt)
	nc := numChunks(b, chunk)
	rr := reduceReceiverOf(c.pg.world.t)
	combine := func(d, s []byte) { reduceInto(d, s, dt, k) }
	jobs := 0
	if parent >= 0 {
		jobs = nc
	}
	return withSender(ctx, c, jobs, func(ctx context.Context, s *sender) error {
		for i := range nc {
			p := chunkOf(b, i, chunk)
			for _, ch := range children {
				var err error
				if rr != nil {
					err = rr.RecvReduce(ctx, c.pg.members[ch], c.tag(stepHostReduce), p, combine)
				} else {
					err = recvThenReduce(ctx, c.pg.world.t, c.pg.members[ch], c.tag(stepHostReduce), p, combine)
				}
				if err != nil {
					return fmt.Errorf("receiving %d bytes from world rank %d: %w", len(p), c.pg.members[ch], err)
				}
			}
			if parent >= 0 {
				s.push(parent, stepHostReduce, p)
			}
		}
		return nil
	})
}
