package rref

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/rpc"
)

// Names of the functions every agent serves for the protocol.
const (
	fnFetch  = "rref.fetch"
	fnFork   = "rref.fork"
	fnDelete = "rref.delete"
	fnAccept = "rref.accept"
	fnCall   = "rref.call"

	// metadata of a Remote call: the ids to create, and the type wanted.
	metaCreate = "rref.create"
	metaType   = "rref.type"
)

type fetchReq struct{ ID ID }

type forkReq struct{ ID, Fork ID }

type deleteReq struct{ ID, Fork ID }

type acceptReq struct{ Fork ID }

type callReq struct {
	ID     ID
	Method string
	Args   []rpc.Any
}

func encodeIDs(id, fork ID) string {
	return fmt.Sprintf("%d.%d.%d.%d", id.Worker, id.Seq, fork.Worker, fork.Seq)
}

func decodeIDs(s string) (id, fork ID, err error) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return ID{}, ID{}, fmt.Errorf("%w: rref: bad creation ids %q", rpc.ErrMalformed, s)
	}
	var n [4]uint64
	for i, p := range parts {
		if n[i], err = strconv.ParseUint(p, 10, 63); err != nil {
			return ID{}, ID{}, fmt.Errorf("%w: rref: bad creation ids %q", rpc.ErrMalformed, s)
		}
	}
	return ID{int(n[0]), n[1]}, ID{int(n[2]), n[3]}, nil
}

// registerProtocol registers the protocol's functions in reg (several
// agents in one process may share a registry, and registering them again
// is no error; each handler finds its own agent in the call's context).
func registerProtocol(reg *rpc.Registry) error {
	return errors.Join(
		rpc.RegisterAsync(reg, fnFetch, serveFetch),
		rpc.Register(reg, fnFork, serveFork),
		rpc.Register(reg, fnDelete, serveDelete),
		rpc.Register(reg, fnAccept, serveAccept),
		rpc.Register(reg, fnCall, serveCall),
	)
}

func handlerContext(ctx context.Context) (*refContext, error) {
	a := rpc.AgentFromContext(ctx)
	if a == nil {
		return nil, fmt.Errorf("rref: protocol function called outside an agent")
	}
	return contextOf(a)
}

// serveFetch answers ToHere: the value once it exists, without holding a
// goroutine meanwhile.
func serveFetch(ctx context.Context, req fetchReq) *rpc.Future[any] {
	rc, err := handlerContext(ctx)
	if err != nil {
		return rpc.Ready[any](nil, err)
	}
	e := rc.entry(req.ID)
	if _, _, done := e.value.Result(); done {
		return e.value
	}
	out := rpc.NewFuture[any]()
	stop := context.AfterFunc(ctx, func() {
		if out.Complete(nil, fmt.Errorf("rref: %s on %s: the value was not created in time: %w", req.ID, rc.agent.Self(), ctx.Err())) {
			rc.dropPlaceholder(e)
		}
	})
	e.value.Then(func(v any, err error) {
		stop()
		out.Complete(v, err)
	})
	return out
}

func serveFork(ctx context.Context, req forkReq) (struct{}, error) {
	rc, err := handlerContext(ctx)
	if err != nil {
		return struct{}{}, err
	}
	rc.addFork(rc.entry(req.ID), req.Fork)
	return struct{}{}, nil
}

func serveDelete(ctx context.Context, req deleteReq) (struct{}, error) {
	rc, err := handlerContext(ctx)
	if err != nil {
		return struct{}{}, err
	}
	rc.delFork(req.ID, req.Fork)
	return struct{}{}, nil
}

func serveAccept(ctx context.Context, req acceptReq) (struct{}, error) {
	rc, err := handlerContext(ctx)
	if err != nil {
		return struct{}{}, err
	}
	rc.childDone(req.Fork)
	return struct{}{}, nil
}

// createInterceptor runs on the owner for calls made by Remote: it registers
// the value and the creator's fork, runs the function, keeps its result (or
// error) as the value and acknowledges with an empty reply.
func (rc *refContext) createInterceptor(ctx context.Context, call *rpc.ServerCall, next rpc.Handler) *rpc.Future[any] {
	ids, ok := call.Meta[metaCreate]
	if !ok {
		return next(ctx, call)
	}
	id, fork, err := decodeIDs(ids)
	if err != nil {
		return rpc.Ready[any](nil, err)
	}
	if want := call.Meta[metaType]; call.ResultType.Kind() != reflect.Interface && call.ResultType.String() != want {
		return rpc.Ready[any](nil, fmt.Errorf("%w: rref: Remote[%s] of %q, which returns %s", rpc.ErrWrongType, want, call.Function, call.ResultType))
	}
	e := rc.entry(id)
	rc.addFork(e, fork)
	return rpc.Then(next(ctx, call), func(v any, err error) (any, error) {
		e.value.Complete(v, err)
		rc.settled(e)
		return struct{}{}, nil
	})
}

func checkResultType(reg *rpc.Registry, fn, want string) error {
	_, res, ok := reg.Signature(fn)
	if !ok {
		return fmt.Errorf("%w: rref: no function %q is registered on this worker; registered: %s", rpc.ErrUnknownFunction, fn, strings.Join(reg.Names(), ", "))
	}
	if res.Kind() != reflect.Interface && res.String() != want {
		return fmt.Errorf("%w: rref: Remote[%s] of %q, which returns %s", rpc.ErrWrongType, want, fn, res)
	}
	return nil
}

// maybeRegistered reports whether a failed creation may still have
// registered the creator's fork on the owner (so a delete is due).
func maybeRegistered(err error) bool {
	return !errors.Is(err, rpc.ErrUnknownFunction) && !errors.Is(err, rpc.ErrWrongType) && !errors.Is(err, rpc.ErrClosed)
}
