package autograd

import (
	"context"
	"fmt"

	"github.com/tandemml/tandem/rpc"
)

// clientInterceptor records, for a call made with a ctx that carries a
// context of this agent, the send function of the tensors it carries and,
// when the reply comes, the receive function of the tensors it returns.
// Both ends take the tensors from the frame's own table (ClientCall.Tensors,
// ServerCall.Tensors, ServerCall.ResultTensors, Response.Tensors), so they
// agree on the order, map entries and rpc.Any values included.
func (m *manager) clientInterceptor(ctx context.Context, call *rpc.ClientCall, next rpc.Invoker) *rpc.Future[*rpc.Response] {
	c := FromContext(ctx)
	if c == nil || c.m != m {
		return next(ctx, call)
	}
	sent, err := call.Tensors()
	if err != nil {
		return next(ctx, call) // the call fails with the encoding's error
	}
	mask, id, err := c.recordSend(call.To.ID, sent)
	if err != nil {
		return rpc.Ready[*rpc.Response](nil, fmt.Errorf("autograd: call %q to worker %s: %w", call.Function, call.To, err))
	}
	meta := make(rpc.Metadata, len(call.Meta)+3)
	for k, v := range call.Meta {
		meta[k] = v
	}
	meta[metaCtx] = formatUint(uint64(c.id))
	if mask != "" {
		meta[metaSend] = formatUint(id)
		meta[metaMask] = mask
	}
	call.Meta = meta
	fn, to := call.Function, call.To
	return rpc.Then(next(ctx, call), func(r *rpc.Response, err error) (*rpc.Response, error) {
		if err != nil {
			c.poison(fmt.Errorf("call %q to worker %s: %w", fn, to, err))
			return r, err
		}
		if r == nil {
			return r, nil
		}
		c.addKnown(r.Meta[metaWorkers])
		if s := r.Meta[metaSend]; s != "" {
			sid, perr := parseUint(s)
			if perr == nil {
				perr = c.recordRecv(to.ID, sid, r.Meta[metaMask], r.Tensors)
			}
			if perr != nil {
				perr = fmt.Errorf("autograd: recording the reply of %q from worker %s: %w", fn, to, perr)
				c.poison(perr)
				return nil, perr
			}
		}
		return r, nil
	})
}

// serverInterceptor joins this worker to the context of an incoming call
// made inside one, records the receive function of its tensors, hands the
// handler a ctx carrying this worker's part of the context, and records the
// send function of the tensors the handler returns.
func (m *manager) serverInterceptor(ctx context.Context, sc *rpc.ServerCall, next rpc.Handler) *rpc.Future[any] {
	s := sc.Meta[metaCtx]
	if s == "" {
		return next(ctx, sc)
	}
	raw, err := parseUint(s)
	if err != nil {
		return rpc.Ready[any](nil, fmt.Errorf("%w: autograd: malformed context id %q", ErrInvalidArgument, s))
	}
	c, err := m.join(ContextID(raw))
	if err != nil {
		return rpc.Ready[any](nil, err)
	}
	if send := sc.Meta[metaSend]; send != "" {
		sid, err := parseUint(send)
		if err == nil {
			err = c.recordRecv(sc.From.ID, sid, sc.Meta[metaMask], sc.Tensors())
		}
		if err != nil {
			return rpc.Ready[any](nil, fmt.Errorf("autograd: recording the argument of %q from worker %s: %w", sc.Function, sc.From, err))
		}
	} else {
		c.addPeer(sc.From.ID)
	}
	from := sc.From
	return rpc.Then(next(NewContextWithAutograd(ctx, c), sc), func(v any, err error) (any, error) {
		reply := rpc.Metadata{}
		for k, x := range sc.ReplyMeta {
			reply[k] = x
		}
		if err == nil {
			// An error here is the one the reply fails with.
			sent, _ := sc.ResultTensors(v)
			mask, id, rerr := c.recordSend(from.ID, sent)
			if rerr != nil {
				err = rerr
			} else if mask != "" {
				reply[metaSend] = formatUint(id)
				reply[metaMask] = mask
			}
		}
		reply[metaWorkers] = c.knownString()
		sc.ReplyMeta = reply
		return v, err
	})
}

func (c *Context) addPeer(w int) {
	c.mu.Lock()
	c.peers[w] = true
	c.known[w] = true
	c.mu.Unlock()
}
