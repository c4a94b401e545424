package rpc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tandemml/tandem/internal/recvbuf"
	"github.com/tandemml/tandem/internal/wire"
	"github.com/tandemml/tandem/launch"
)

// onRequest handles a frame read from a server connection. For a call to a
// sync function it returns the work to run on a goroutine of its own (the
// read loop hands reading to a new goroutine and runs it itself, so the
// handler starts without a scheduling hop).
func (a *Agent) onRequest(c *conn, f *wire.Frame) (handler func()) {
	switch f.Kind {
	case wire.KindRequest:
	case wire.KindCancel:
		c.rmu.Lock()
		cc := c.running[f.ID]
		c.rmu.Unlock()
		if cc != nil {
			cc.cancel(context.Canceled)
		}
		return nil
	default:
		c.close(wire.Malformed("worker %s sent a frame of kind %d on a server connection", c.peer, f.Kind))
		return nil
	}
	a.m.requestStart()
	e := a.reg.lookup(f.Fn)
	if e == nil {
		err := a.reg.unknownFunction(a.self.Name, f.Fn)
		return func() { a.reply(c, f, f.Fn, nil, nil, nil, err) }
	}
	if e.async {
		a.serve(c, f, e)
		return nil
	}
	return func() { a.serve(c, f, e) }
}

// serve decodes the argument, runs the interceptors and the function, and
// sends the reply when the function's future completes.
func (a *Agent) serve(c *conn, f *wire.Frame, e *entry) {
	cc := &callCtx{parent: a.life.ctx, caller: c.peer, meta: f.Meta, agent: a}
	if f.Aux > 0 {
		cc.deadline = time.Now().Add(time.Duration(f.Aux))
	}
	var ctx context.Context = cc
	c.rmu.Lock()
	c.running[f.ID] = cc
	c.rmu.Unlock()
	done := func(settled bool) {
		c.rmu.Lock()
		delete(c.running, f.ID)
		c.rmu.Unlock()
		cc.cancel(context.Canceled)
		if e.reuseArg && settled {
			// The reply is sent (and copied, when by reference): the
			// function promised to keep nothing of the argument.
			for _, b := range f.Blocks {
				recvbuf.Release(b)
			}
		}
	}
	argV, err := decodeTop(e.argType, f.Type, f.Payload, f.Tensors, peerOf(a, c.peer))
	if err != nil {
		err = wrongTypef("function %q takes an argument of type %s, the caller sent %s: %v", e.name, e.argType, displayType(f.Type), err)
		if e.async { // on the read loop: do not write from it
			go func() {
				done(a.reply(c, f, f.Fn, nil, nil, nil, err))
			}()
			return
		}
		done(a.reply(c, f, f.Fn, nil, nil, nil, err))
		return
	}
	sc := &ServerCall{From: c.peer, Function: e.name, ArgType: e.argType, ResultType: e.resType, Meta: f.Meta, tensors: f.Tensors, agent: a}
	if argV.IsValid() {
		sc.Arg = argV.Interface()
	}
	final := func(ctx context.Context, sc *ServerCall) *Future[any] { return safeInvoke(ctx, e, sc.Arg) }
	var fut *Future[any]
	if ics := *a.serverIC.Load(); len(ics) > 0 {
		fut = safeHandle(ctx, sc, chainServer(ics, final))
	} else {
		fut = final(ctx, sc)
	}
	// An async function runs on the read loop; if its future is already
	// complete, the callback below runs there too, and the read loop must
	// not block writing the reply (the peer may be blocked writing to us).
	var returned atomic.Bool
	fut.Then(func(v any, err error) {
		if err != nil && errors.Is(err, context.DeadlineExceeded) && cc.Err() == context.DeadlineExceeded {
			err = &handlerError{code: codeTimeout, msg: fmt.Sprintf("the call's timeout of %v passed while %q ran: %v", time.Duration(f.Aux), e.name, err), err: err}
		}
		if e.async && !returned.Load() {
			go func() {
				done(a.reply(c, f, e.name, sc.ReplyMeta, &sc.result, v, err))
			}()
			return
		}
		done(a.reply(c, f, e.name, sc.ReplyMeta, &sc.result, v, err))
	})
	returned.Store(true)
}

func displayType(t string) string {
	if t == nilTypeName {
		return "nil"
	}
	return t
}

// safeInvoke runs the registered function, turning a panic into an error.
func safeInvoke(ctx context.Context, e *entry, arg any) (f *Future[any]) {
	defer func() {
		if r := recover(); r != nil {
			f = Ready[any](nil, panicError(r))
		}
	}()
	return e.invoke(ctx, arg)
}

func safeHandle(ctx context.Context, sc *ServerCall, h Handler) (f *Future[any]) {
	defer func() {
		if r := recover(); r != nil {
			f = Ready[any](nil, panicError(r))
		}
	}()
	f = h(ctx, sc)
	if f == nil {
		f = Ready[any](nil, fmt.Errorf("rpc: a server interceptor returned a nil future"))
	}
	return f
}

func panicError(r any) error {
	return &handlerError{code: codePanic, msg: fmt.Sprintf("panic: %v\n%s", r, trimStack(debug.Stack()))}
}

// trimStack keeps the frames from the panicking function down to the
// registered function, without the runtime's frames above or this package's
// frames below.
func trimStack(stack []byte) string {
	lines := strings.Split(strings.TrimSpace(string(stack)), "\n")
	// Frames come in pairs: "pkg.func(args)" then "\tfile:line".
	var out []string
	seenPanic := false
	for i := 1; i+1 < len(lines); i += 2 {
		fn, loc := lines[i], lines[i+1]
		if !seenPanic {
			seenPanic = strings.HasPrefix(fn, "panic(")
			continue
		}
		if strings.HasPrefix(fn, "runtime.") {
			continue
		}
		if isOwnFrame(fn) {
			break
		}
		out = append(out, fn, loc)
		if len(out) >= 20 {
			break
		}
	}
	return strings.Join(out, "\n")
}

func isOwnFrame(fn string) bool {
	for _, p := range []string{"tandem/rpc.Register", "tandem/rpc.safeInvoke", "tandem/rpc.safeHandle", "tandem/rpc.chainServer", "tandem/rpc.(*Agent).serve"} {
		if strings.Contains(fn, p) {
			return true
		}
	}
	return false
}

// reply sends a call's result or error. It reports whether the frame is
// settled: written, and when by reference, copied by the caller, so that
// the tensors in v may change. pre (may be nil) holds the encoding of v
// that an interceptor asked for (ServerCall.ResultTensors).
func (a *Agent) reply(c *conn, req *wire.Frame, fn string, meta Metadata, pre *pending, v any, err error) (settled bool) {
	id := req.ID
	f := wire.Frame{ID: id, Meta: meta}
	var grant *peerGrant
	var enc *encoded
	if err == nil {
		if pre != nil {
			enc = pre.take(a, c.peer, v)
		} else {
			enc = encodeValue(a, c.peer, v)
		}
		defer enc.free()
		if enc.err != nil {
			err = fmt.Errorf("rpc: cannot send the result (%T) of %q: %w", v, fn, enc.err)
		} else {
			f.Kind, f.Type, f.Payload, f.Tensors = wire.KindResponse, enc.typ, enc.enc.Payload(), enc.enc.Sent()
			if c.byRefOK(f.Tensors) {
				f.Flags = wire.FlagByRef
				if req.Flags&wire.FlagLent == 0 {
					if grant, f.Push = c.takeGrant(f.Tensors); grant != nil {
						f.Flags |= wire.FlagPushed
					}
				}
			}
		}
	} else if pre != nil {
		pre.drop()
	}
	hb := getBuf()
	defer putBuf(hb)
	var head []byte
	if err == nil {
		var data uint64
		head, data, err = wire.AppendHead((*hb)[:0], &f)
		if err == nil && int64(len(head)-wire.HeaderLen)+int64(data) > a.opts.maxMessage {
			err = &handlerError{code: codeTooLarge, msg: fmt.Sprintf("the result of %q makes a message of %d bytes, over the limit of %d (WithMaxMessageSize)", fn, len(head)-wire.HeaderLen+int(data), a.opts.maxMessage), err: ErrTooLarge}
		}
	}
	if err != nil {
		code, mask, msg := classify(err)
		if len(msg) > 64<<10 {
			msg = msg[:64<<10] + "…"
		}
		if grant != nil {
			c.pushAbort(grant)
			grant = nil
		}
		f = wire.Frame{Kind: wire.KindError, Code: byte(code), ID: id, Aux: mask, Payload: []byte(msg), Meta: meta}
		head, _, _ = wire.AppendHead((*hb)[:0], &f)
		if enc != nil {
			enc.abandon() // the result does not go
		}
	}
	*hb = head
	settled = true
	if f.Flags&wire.FlagByRef != 0 {
		ack := c.expectAck(id)
		werr := c.write(wire.Buffers(head, &f))
		if grant != nil {
			if werr != nil {
				c.pushAbort(grant)
			} else {
				c.pushTail(grant, f.Tensors[f.Push.Index].Header.Raw)
			}
		}
		if werr != nil {
			c.dropAck(id)
			enc.abandon()
		} else if aerr := c.awaitAck(ack, id, nil, a.opts.timeout); aerr != nil {
			// The caller copies the result out of this process: it must stay
			// as it is until the caller has.
			a.opts.logger.Warn("rpc: a reply was not copied", "worker", a.self.Name, "peer", c.peer.String(), "err", aerr)
			settled = false
		}
		runtime.KeepAlive(f.Tensors)
	} else if werr := c.write(wire.Buffers(head, &f)); werr != nil {
		enc.abandon()
	}
	a.m.requestDone(err)
	if a.opts.debug >= launch.DebugDetail {
		a.opts.logger.Info("rpc: request served", "worker", a.self.Name, "from", c.peer.Name, "fn", fn, "err", err)
	}
	return settled
}
