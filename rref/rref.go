package rref

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/tandemml/tandem/rpc"
)

// RRef is a reference to a value of type T that lives on one worker, its
// owner. On the owner the reference is an owner reference (IsOwner): it
// holds the value itself. Elsewhere it is a user reference: ToHere fetches a
// copy of the value, Call runs a method on it where it lives. Use RRefs
// through pointers (*RRef[T]), as the functions of this package return them.
type RRef[T any] struct {
	st *state
}

// state is what an RRef handle refers to; the handle may be collected while
// the tables still hold the state (its cleanup then releases it).
type state struct {
	rc       *refContext
	owner    rpc.WorkerInfo
	id       ID
	fork     ID          // user references: this user's fork
	entry    *ownerEntry // owner references
	typeName string
	fn       string // the function that created the value, when known here

	// created completes when the owner has registered this user's fork (the
	// creation acknowledged, or the fork accepted); with an error if that
	// failed.
	created   *rpc.Future[struct{}]
	confirmed atomic.Bool
	released  atomic.Bool

	// guarded by rc.mu
	pendingChildren int
	releaseWanted   bool
	deleteOnce      sync.Once
}

func typeNameOf[T any]() string { return reflect.TypeFor[T]().String() }

// Remote runs fn on worker to with arg and keeps the result there, owned by
// that worker; it returns a user reference at once, without waiting for fn.
// The creation is confirmed by the owner in the background
// (ConfirmedByOwner, WaitConfirmed); ToHere waits for the value, and fn's
// error, if any, comes back from ToHere. fn must be registered on the owner
// with result type T (or an interface type). When to is this worker, the
// result is an owner reference and fn runs on a goroutine here.
//
// The returned error reports only what is wrong at once (no such worker,
// agent shut down, agent without rref): an *rpc.CallError with Op "remote",
// as is the error of the creation that ToHere and WaitConfirmed return.
func Remote[T any](ctx context.Context, a *rpc.Agent, to, fn string, arg any, opts ...rpc.CallOption) (*RRef[T], error) {
	rc, err := contextOf(a)
	if err != nil {
		return nil, callError("remote", to, fn, err)
	}
	w, err := a.WorkerInfo(to)
	if err != nil {
		return nil, callError("remote", to, fn, err)
	}
	tn := typeNameOf[T]()
	if w.ID == a.Self().ID {
		if err := checkResultType(a.Registry(), fn, tn); err != nil {
			return nil, callError("remote", to, fn, err)
		}
		e := newEntry(rc.newID())
		a.CallLocal(ctx, fn, arg).Then(func(v any, err error) {
			e.value.Complete(v, callError("remote", to, fn, err))
			rc.settled(e)
		})
		r := ownerRef[T](rc, e)
		r.st.fn = fn
		return r, nil
	}
	id := rc.newID()
	st := &state{rc: rc, owner: w, id: id, fork: id, typeName: tn, fn: fn, created: rpc.NewFuture[struct{}]()}
	rc.mu.Lock()
	rc.users[id] = st
	rc.mu.Unlock()
	opts = append(opts, rpc.WithMetadata(rpc.Metadata{metaCreate: encodeIDs(id, id), metaType: tn}))
	rpc.Async[struct{}](ctx, a, to, fn, arg, opts...).Then(func(_ struct{}, err error) {
		if err == nil {
			st.confirmed.Store(true)
		}
		st.created.Complete(struct{}{}, callError("remote", to, fn, err))
	})
	return userRef[T](st), nil
}

// callError is the *rpc.CallError of an rref operation: op, on worker
// peer, of function fn, with cause err; an error that is itself a call's
// *rpc.CallError (the protocol call op made) gives its cause.
func callError(op, peer, fn string, err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := err.(*rpc.CallError); ok {
		if ce.Op == op && ce.Peer == peer && ce.Func == fn {
			return err
		}
		err = ce.Err
	}
	return &rpc.CallError{Op: op, Peer: peer, Func: fn, Err: err}
}

// LocalRRef makes an owner reference to value on this worker, to pass to
// other workers. It fails only on an agent without rref.
func LocalRRef[T any](a *rpc.Agent, value T) (*RRef[T], error) {
	rc, err := contextOf(a)
	if err != nil {
		return nil, err
	}
	e := newEntry(rc.newID())
	e.value.Complete(value, nil)
	return ownerRef[T](rc, e), nil
}

func ownerRef[T any](rc *refContext, e *ownerEntry) *RRef[T] {
	st := &state{rc: rc, owner: rc.agent.Self(), id: e.id, entry: e, typeName: typeNameOf[T](), created: rpc.Ready(struct{}{}, nil)}
	st.confirmed.Store(true)
	return &RRef[T]{st: st}
}

// userRef wraps a user state in a handle whose collection releases it.
func userRef[T any](st *state) *RRef[T] {
	r := &RRef[T]{}
	r.bind(st)
	return r
}

// bind points the handle r at a user state and makes r's collection
// release it (r may be a field of a larger value: the cleanup then runs
// when that value is collected).
func (r *RRef[T]) bind(st *state) {
	r.st = st
	runtime.AddCleanup(r, collected, cleanupArg{rc: st.rc, fork: st.fork})
}

type cleanupArg struct {
	rc   *refContext
	fork ID
}

// collected releases a user reference whose handle was garbage collected
// without Release.
func collected(c cleanupArg) {
	c.rc.mu.Lock()
	st := c.rc.users[c.fork]
	c.rc.mu.Unlock()
	if st == nil || st.released.Load() {
		return
	}
	select {
	case <-c.rc.agent.ShuttingDown():
		return // the shutdown hook reports and releases it
	default:
	}
	c.rc.agent.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, c.rc.agent.DefaultTimeout())
		defer cancel()
		if err := st.release(ctx, false); err != nil {
			c.rc.agent.Logger().Debug("rref: releasing a collected reference failed", "rref", st.id.String(), "err", err)
		}
	})
}

// IsOwner reports whether this is the owner's reference.
func (r *RRef[T]) IsOwner() bool { return r.st.entry != nil }

// Owner returns the worker that owns the value.
func (r *RRef[T]) Owner() rpc.WorkerInfo { return r.st.owner }

// ID returns the reference's id (the same on every worker).
func (r *RRef[T]) ID() ID { return r.st.id }

// ConfirmedByOwner reports whether the owner knows of this reference (always
// true for the owner's own).
func (r *RRef[T]) ConfirmedByOwner() bool { return r.st.confirmed.Load() }

// WaitConfirmed waits until the owner knows of this reference, and returns
// the error that kept it from doing so (for Remote: the call failed before
// fn could run, e.g. an unknown function).
func (r *RRef[T]) WaitConfirmed(ctx context.Context) error {
	_, err := r.st.created.Wait(ctx)
	return err
}

func (r *RRef[T]) String() string {
	kind := "user"
	if r.IsOwner() {
		kind = "owner"
	}
	return fmt.Sprintf("RRef[%s](%s, %s on %s)", r.st.typeName, r.st.id, kind, r.st.owner.Name)
}

// LocalValue returns the value on its owner. It fails on a user reference,
// and on the owner while Remote's function is still running.
func (r *RRef[T]) LocalValue() (T, error) {
	var zero T
	if r.st.entry == nil {
		return zero, fmt.Errorf("%w: rref: LocalValue on worker %s of %s, which is owned by %s; use ToHere", rpc.ErrInvalidArgument, r.st.rc.agent.Self(), r.st.id, r.st.owner)
	}
	v, err, ok := r.st.entry.value.Result()
	if !ok {
		return zero, fmt.Errorf("%w: rref: the value of %s is still being created; use ToHere to wait for it", rpc.ErrInvalidArgument, r.st.id)
	}
	if err != nil {
		return zero, err
	}
	return valueAs[T](v, r.st.id)
}

func valueAs[T any](v any, id ID) (T, error) {
	var zero T
	if v == nil {
		return zero, nil
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: rref: %s holds a %T, not a %s", rpc.ErrWrongType, id, v, typeNameOf[T]())
	}
	return t, nil
}

// ToHere returns the value: on the owner, once it is created; elsewhere a
// copy fetched from the owner. An owner that died makes it fail with
// ErrPeerLost, one that does not answer with ErrTimeout (the call's timeout:
// rpc.WithTimeout, else the agent's default, and ctx's deadline). If the
// function that creates the value failed, ToHere returns its error. Errors
// are *rpc.CallError with Op "to_here", naming the owner and (where this
// worker made the reference with Remote) the creating function.
func (r *RRef[T]) ToHere(ctx context.Context, opts ...rpc.CallOption) (T, error) {
	v, err := r.toHere(ctx, opts)
	return v, callError("to_here", r.st.owner.Name, r.st.fn, err)
}

func (r *RRef[T]) toHere(ctx context.Context, opts []rpc.CallOption) (T, error) {
	var zero T
	st := r.st
	if st.entry != nil {
		v, err := st.entry.value.Wait(ctx)
		if err != nil {
			return zero, err
		}
		return valueAs[T](v, st.id)
	}
	if st.released.Load() {
		return zero, fmt.Errorf("%w: rref: ToHere on %s after Release", rpc.ErrInvalidArgument, st.id)
	}
	// The fetch goes out at once, without waiting for the creation's
	// acknowledgement; if the creation fails, the fetch is cancelled.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := rpc.Async[T](fctx, st.rc.agent, st.owner.Name, fnFetch, fetchReq{ID: st.id}, opts...)
	select {
	case <-f.Done():
	case <-st.created.Done():
		if _, err, _ := st.created.Result(); err != nil {
			return zero, err
		}
	}
	return f.Wait(ctx)
}

// Release gives up this reference: a user reference tells the owner, which
// deletes the value once every user has released it (and no owner reference
// is in use on the owner). Releasing twice is harmless; an owner reference
// needs no release. A user reference that is garbage collected unreleased
// is released by a cleanup, but do not rely on that: references not
// released at shutdown are reported as leaked.
func (r *RRef[T]) Release(ctx context.Context) error {
	if r.st.entry != nil {
		return nil
	}
	err := r.st.release(ctx, false)
	runtime.KeepAlive(r)
	return err
}

// release drops the user's fork: at once, or when the forks it sent on are
// accepted.
func (st *state) release(ctx context.Context, atShutdown bool) error {
	if !st.released.CompareAndSwap(false, true) {
		return nil
	}
	rc := st.rc
	rc.mu.Lock()
	delete(rc.users, st.fork)
	if st.pendingChildren > 0 {
		st.releaseWanted = true
		rc.mu.Unlock()
		return nil
	}
	rc.mu.Unlock()
	return st.sendDelete(ctx)
}

func (st *state) sendDelete(ctx context.Context) error {
	var err error
	st.deleteOnce.Do(func() {
		if _, cerr, done := st.created.Result(); done && cerr != nil {
			if !maybeRegistered(cerr) {
				return // the owner never registered this fork
			}
		}
		_, err = rpc.Sync[struct{}](ctx, st.rc.agent, st.owner.Name, fnDelete, deleteReq{ID: st.id, Fork: st.fork})
		if err != nil {
			err = fmt.Errorf("rref: releasing %s on its owner %s: %w", st.id, st.owner, err)
		}
	})
	return err
}
