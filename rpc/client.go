package rpc

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/liveness"
	"github.com/tandemml/tandem/internal/wire"
	"github.com/tandemml/tandem/launch"
)

// Sync calls fn on worker to with arg and waits for its result, which must
// be of type R (the function's registered result type). A failure is a
// *CallError (Op "call") whose cause wraps ErrTimeout (the call's timeout
// or ctx's deadline passed, with context.DeadlineExceeded for the latter),
// context.Canceled (ctx was cancelled), ErrPeerLost (the worker died or is
// unreachable), ErrClosed (this agent shut down), ErrUnknownFunction,
// ErrWrongType, ErrRemote (the function failed; ErrPanic if it panicked;
// the cause is then a *RemoteError) or ErrTooLarge.
func Sync[R any](ctx context.Context, a *Agent, to, fn string, arg any, opts ...CallOption) (R, error) {
	f := a.call(ctx, to, fn, arg, reflect.TypeFor[R](), opts, true)
	r, err := f.Wait(ctx)
	v, err := valueAs[R](r, err)
	return v, callError("call", to, fn, err)
}

// Async starts a call like Sync and returns its future at once. It returns
// after the request is written to the connection, so arg (and its tensors)
// may be changed as soon as it returns. The call ends with an error if ctx
// ends first. Its errors are those of Sync, a *CallError.
func Async[R any](ctx context.Context, a *Agent, to, fn string, arg any, opts ...CallOption) *Future[R] {
	f := a.call(ctx, to, fn, arg, reflect.TypeFor[R](), opts, false)
	return Then(f, func(r *Response, err error) (R, error) {
		v, err := valueAs[R](r, err)
		return v, callError("call", to, fn, err)
	})
}

func valueAs[R any](r *Response, err error) (R, error) {
	var zero R
	if err != nil {
		return zero, err
	}
	if r == nil || r.Value == nil {
		return zero, nil
	}
	v, ok := r.Value.(R)
	if !ok {
		return zero, fmt.Errorf("a result of type %T, the caller asked for %s: %w", r.Value, reflect.TypeFor[R](), ErrWrongType)
	}
	return v, nil
}

// Call is the untyped form of Async for packages built on rpc: it decodes
// the result into resultType and hands back the interceptors' view of the
// outcome. Its errors are those of Sync, a *CallError.
func (a *Agent) Call(ctx context.Context, to, fn string, arg any, resultType reflect.Type, opts ...CallOption) *Future[*Response] {
	return Then(a.call(ctx, to, fn, arg, resultType, opts, false), func(r *Response, err error) (*Response, error) {
		return r, callError("call", to, fn, err)
	})
}

func (a *Agent) call(ctx context.Context, to, fn string, arg any, resType reflect.Type, opts []CallOption, waits bool) *Future[*Response] {
	if err := a.running(); err != nil {
		return Ready[*Response](nil, err)
	}
	w, err := a.WorkerInfo(to)
	if err != nil {
		return Ready[*Response](nil, err)
	}
	var co callOptions
	for _, o := range opts {
		if o != nil {
			o(&co)
		}
	}
	if co.timeout <= 0 {
		co.timeout = a.opts.timeout
	}
	call := &ClientCall{To: w, Function: fn, Arg: arg, ResultType: resType, Meta: co.meta, Timeout: co.timeout, waits: waits, into: co.into, agent: a}
	ics := *a.clientIC.Load()
	if len(ics) == 0 {
		return a.invoke(ctx, call)
	}
	fut := chainClient(ics, a.invoke)(ctx, call)
	// An encoding that an interceptor asked for (Tensors) and that no
	// invoker took: the call did not go (or goes later, encoded then).
	call.pre.drop()
	return fut
}

// pendingCall is a call awaiting its reply.
type pendingCall struct {
	a       *Agent
	c       *conn
	id      uint64
	fn      string
	resType reflect.Type
	fut     *Future[*Response]
	start   time.Time
	timer   *time.Timer
	stopCtx func() bool
	// keep holds tensors the callee copies out of this process without
	// acknowledging (wire.FlagNoAck) until the call ends.
	keep []*tensor.Dense
	// into: tensors lent for the result (WithResultInto); filling is open
	// while the read loop copies a reply into them, and the call does not
	// end before it closes.
	into    []*tensor.Dense
	filling chan struct{}
	mu      sync.Mutex // guards timer, stopCtx and filling against finish
	ended   bool
}

// finish completes the call once (the caller has removed it from pending).
func (p *pendingCall) finish(r *Response, err error) {
	p.mu.Lock()
	p.ended = true
	if p.keep != nil {
		if err == nil {
			p.a.m.byRef.Add(1)
		}
		p.keep = nil
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.stopCtx != nil {
		p.stopCtx()
	}
	filling := p.filling
	p.mu.Unlock()
	if filling != nil {
		// The caller gets its lent tensors back only once nothing writes
		// into them (a local copy, short).
		<-filling
	}
	took := time.Since(p.start)
	p.a.m.callDone(took, err)
	if a := p.a; a.opts.debug >= launch.DebugDetail {
		a.opts.logger.Info("rpc: call", "worker", a.self.Name, "to", p.c.peer.Name, "fn", p.fn, "took", took, "err", err)
	}
	p.fut.Complete(r, err)
}

func (c *conn) register(p *pendingCall) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.dead.Load() {
		return false
	}
	c.nextID++
	p.id = c.nextID
	c.pending[p.id] = p
	return true
}

// lent returns the tensors call id lent for its result, if it is still
// waiting, and marks it as being filled until the returned function runs.
func (c *conn) lent(id uint64) ([]*tensor.Dense, func()) {
	c.pmu.Lock()
	p := c.pending[id]
	c.pmu.Unlock()
	if p == nil || len(p.into) == 0 {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, nil
	}
	ch := make(chan struct{})
	p.filling = ch
	return p.into, func() { close(ch) }
}

func (c *conn) take(id uint64) *pendingCall {
	c.pmu.Lock()
	p := c.pending[id]
	delete(c.pending, id)
	c.pmu.Unlock()
	return p
}

// invoke is the innermost Invoker: it encodes the call and writes it.
func (a *Agent) invoke(ctx context.Context, call *ClientCall) *Future[*Response] {
	fut := NewFuture[*Response]()
	start := time.Now()
	if err := ctx.Err(); err != nil {
		fut.Complete(nil, ctxError(ctx, "the context ended before the call was sent"))
		return fut
	}
	timeout := call.Timeout
	if timeout <= 0 {
		timeout = a.opts.timeout
	}
	enc := call.pre.take(a, call.To, call.Arg)
	sent := false
	defer func() {
		if sent {
			enc.free()
		} else {
			enc.abandon()
		}
	}()
	typ, err := enc.typ, enc.err
	if err != nil {
		fut.Complete(nil, fmt.Errorf("cannot send the argument (%T): %w", call.Arg, err))
		return fut
	}
	p := &pendingCall{a: a, fn: call.Function, resType: call.ResultType, fut: fut, start: start, into: call.into}
	var c *conn
	for attempt := 0; ; attempt++ {
		c, err = a.connect(ctx, call.To, timeout)
		if err != nil {
			fut.Complete(nil, err)
			return fut
		}
		p.c = c
		a.m.callStart()
		if c.register(p) {
			break
		}
		a.m.clientInFlight.Add(-1)
		if attempt > 0 {
			fut.Complete(nil, fmt.Errorf("the connection to worker %s was lost: %w", call.To, ErrPeerLost))
			return fut
		}
	}
	id := p.id
	f := wire.Frame{Kind: wire.KindRequest, ID: id, Fn: call.Function, Type: typ, Aux: uint64(timeout), Meta: call.Meta, Payload: enc.enc.Payload(), Tensors: enc.enc.Sent()}
	byRef := c.byRefOK(f.Tensors)
	var grant *peerGrant
	if byRef {
		f.Flags = wire.FlagByRef
		if grant, f.Push = c.takeGrant(f.Tensors); grant != nil {
			f.Flags |= wire.FlagPushed
		}
		if call.waits {
			// The caller waits for the reply, which comes after the callee
			// has copied the tensors: no read-done frame, and the tensors
			// stay reachable through p until the call ends.
			f.Flags |= wire.FlagNoAck
			p.mu.Lock()
			p.keep = f.Tensors
			p.mu.Unlock()
			byRef = false
		}
	}
	if len(call.into) > 0 && c.pushOK {
		// The reply goes into the lent memory: the callee is not to push
		// it into memory granted for it.
		f.Flags |= wire.FlagLent
	}
	hb := getBuf()
	defer putBuf(hb)
	head, data, err := wire.AppendHead((*hb)[:0], &f)
	*hb = head
	if err == nil && int64(len(head)-wire.HeaderLen)+int64(data) > a.opts.maxMessage {
		err = fmt.Errorf("the argument makes a message of %d bytes, over the limit of %d (WithMaxMessageSize): %w", len(head)-wire.HeaderLen+int(data), a.opts.maxMessage, ErrTooLarge)
	}
	if err != nil {
		if grant != nil {
			c.pushAbort(grant)
		}
		if q := c.take(id); q != nil {
			q.finish(nil, err)
		}
		return fut
	}
	p.mu.Lock()
	if !p.ended {
		p.timer = time.AfterFunc(timeout, func() {
			if q := c.take(id); q != nil {
				c.cancelRemote(id)
				q.finish(nil, fmt.Errorf("no reply within the call's timeout of %v: %w", timeout, ErrTimeout))
			}
		})
		if ctx.Done() != nil {
			p.stopCtx = context.AfterFunc(ctx, func() {
				if q := c.take(id); q != nil {
					c.cancelRemote(id)
					q.finish(nil, ctxError(ctx, "the context ended before the reply"))
				}
			})
		}
	}
	p.mu.Unlock()
	var ack chan struct{}
	if byRef {
		ack = c.expectAck(id)
	}
	if err := c.write(wire.Buffers(head, &f)); err != nil {
		if byRef {
			c.dropAck(id)
		}
		if grant != nil {
			c.pushAbort(grant)
		}
		if q := c.take(id); q != nil {
			q.finish(nil, fmt.Errorf("sending the call failed: %v: %w", err, ErrPeerLost))
		}
		return fut
	}
	if grant != nil {
		c.pushTail(grant, f.Tensors[f.Push.Index].Header.Raw)
	}
	sent = true
	a.m.sent.Add(1)
	if byRef {
		// The callee copies the tensors out of this process: they must stay
		// as they are until it has.
		if err := c.awaitAck(ack, id, fut.Done(), timeout); err != nil {
			if q := c.take(id); q != nil {
				q.finish(nil, err)
			}
		}
		runtime.KeepAlive(f.Tensors)
	}
	return fut
}

// connect returns the connection to worker w, dialling it within timeout,
// and with the liveness check on, within twice its timeout: a worker that
// accepts the connection (its kernel does) but does not answer the
// handshake is frozen, and is reported as unresponsive (ErrPeerLost).
func (a *Agent) connect(ctx context.Context, w WorkerInfo, timeout time.Duration) (*conn, error) {
	lc := a.opts.live
	if lc.Timeout <= 0 || 2*lc.Timeout >= timeout {
		return a.connTo(ctx, w.ID, timeout)
	}
	bound := 2 * lc.Timeout
	start := time.Now()
	errSilent := errors.New("no answer")
	dctx, cancel := context.WithTimeoutCause(ctx, bound, errSilent)
	defer cancel()
	c, err := a.connTo(dctx, w.ID, timeout)
	if err != nil && ctx.Err() == nil && context.Cause(dctx) == errSilent {
		return nil, fmt.Errorf("%w: rpc: connecting to worker %s: the worker is %s", ErrPeerLost, w, liveness.Unresponsive(start))
	}
	return c, err
}

// cancelRemote tells the callee to cancel the handler of call id.
func (c *conn) cancelRemote(id uint64) {
	c.post(control(wire.KindCancel, id))
}

// onReply completes the call a reply frame answers.
func (a *Agent) onReply(c *conn, f *wire.Frame) {
	if f.Kind != wire.KindResponse && f.Kind != wire.KindError {
		c.close(wire.Malformed("worker %s sent a frame of kind %d on a client connection", c.peer, f.Kind))
		return
	}
	p := c.take(f.ID)
	if p == nil {
		return // the call timed out or was cancelled; drop the late reply
	}
	if f.Kind == wire.KindError {
		p.finish(nil, newRemoteError(c.peer.Name, p.fn, errCode(f.Code), f.Aux, string(f.Payload)))
		return
	}
	v, err := decodeTop(p.resType, f.Type, f.Payload, f.Tensors, peerOf(a, c.peer))
	if err != nil {
		if errors.Is(err, ErrWrongType) {
			err = fmt.Errorf("the function returned %s but the caller asked for %s: %w", f.Type, p.resType, err)
		} else {
			err = fmt.Errorf("decoding the reply: %w", err)
		}
		p.finish(nil, err)
		return
	}
	var val any
	if v.IsValid() {
		val = v.Interface()
	}
	p.finish(&Response{Value: val, Meta: f.Meta, Tensors: f.Tensors}, nil)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= 1<<20 {
		*b = (*b)[:0]
		bufPool.Put(b)
	}
}

// CallLocal runs the function registered under fn on this worker, with arg
// as it is (no encoding: arg must have the function's argument type, or be
// nil), as if this worker had called itself: a sync function runs on a
// goroutine of its own, and graceful shutdown waits for it. rref uses it
// for rref.Remote to the caller's own worker. Its errors are those of Sync,
// a *CallError.
func (a *Agent) CallLocal(ctx context.Context, fn string, arg any) *Future[any] {
	fail := func(err error) *Future[any] { return Ready[any](nil, callError("call", a.self.Name, fn, err)) }
	if err := a.running(); err != nil {
		return fail(err)
	}
	e := a.reg.lookup(fn)
	if e == nil {
		return fail(newRemoteError(a.self.Name, fn, codeUnknownFunction, 0, a.reg.unknownFunction(a.self.Name, fn).Error()))
	}
	if arg != nil && !reflect.TypeOf(arg).AssignableTo(e.argType) {
		return fail(fmt.Errorf("the function takes an argument of type %s, got %T: %w", e.argType, arg, ErrWrongType))
	}
	ctx = context.WithValue(ctx, callerKey, a.self)
	ctx = context.WithValue(ctx, agentKey, a)
	wrap := func(v any, err error) (any, error) {
		if err != nil {
			var he *handlerError
			if errors.As(err, &he) {
				// A panic or a refusal, as a remote caller would see it.
				code, mask, msg := classify(err)
				err = newRemoteError(a.self.Name, fn, code, mask, msg)
			}
		}
		return v, callError("call", a.self.Name, fn, err)
	}
	if e.async {
		return Then(safeInvoke(ctx, e, arg), wrap)
	}
	release := a.hold()
	out := NewFuture[any]()
	go func() {
		defer release()
		safeInvoke(ctx, e, arg).Then(func(v any, err error) { out.Complete(wrap(v, err)) })
	}()
	return out
}
