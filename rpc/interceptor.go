package rpc

import (
	"context"
	"reflect"
	"time"

	"gorgonia.org/tensor"
)

// Metadata carries small key/value pairs with a call (and with its reply),
// for interceptors such as distributed autograd's context propagation.
type Metadata map[string]string

// ClientCall describes an outgoing call to client interceptors. An
// interceptor may change Arg and add Meta before passing the call on.
type ClientCall struct {
	To         WorkerInfo
	Function   string
	Arg        any
	ResultType reflect.Type // the type the caller decodes the result into
	Meta       Metadata     // sent with the request
	Timeout    time.Duration

	// waits: the caller blocks until the reply (Sync), so tensors sent by
	// reference need no read-done frame: the reply itself says the callee
	// has copied them.
	waits bool
	// into: tensors lent for the result (WithResultInto).
	into []*tensor.Dense
	// agent makes the call; pre holds the argument's encoding once
	// Tensors has made it, for the frame to take.
	agent *Agent
	pre   pending
}

// Tensors returns the tensors the call's argument carries, each once, in
// the order they travel: the frame's own table, which the callee's
// ServerCall.Tensors lists in the same order. Distributed autograd records
// a send function over them. It encodes Arg as it stands (an error is the
// one the call would fail with), and the call sends that encoding: an
// interceptor that changes Arg afterwards must assign it anew, and the
// call then encodes it again.
func (c *ClientCall) Tensors() ([]*tensor.Dense, error) {
	e := c.pre.get(c.agent, c.To, c.Arg)
	return e.enc.Tensors(), e.err
}

// Response is a call's outcome as client interceptors see it: the decoded
// result and the metadata the callee sent back.
type Response struct {
	Value any
	Meta  Metadata
	// Tensors: the tensors the reply carried, each once, in the order they
	// travelled (the callee's ServerCall.ResultTensors, in the same order).
	Tensors []*tensor.Dense
}

// Invoker sends a call; the innermost one writes it to the wire.
type Invoker func(ctx context.Context, call *ClientCall) *Future[*Response]

// ClientInterceptor wraps outgoing calls: it may inspect or change the call,
// then passes it to next, and may transform the future's outcome (with
// Then, so that no goroutine waits). Distributed autograd records a send
// here for every call that carries tensors.
type ClientInterceptor func(ctx context.Context, call *ClientCall, next Invoker) *Future[*Response]

// ServerCall describes an incoming call to server interceptors, with its
// argument already decoded.
type ServerCall struct {
	From       WorkerInfo
	Function   string
	Arg        any
	ArgType    reflect.Type
	ResultType reflect.Type // the registered function's result type
	Meta       Metadata     // received with the request
	ReplyMeta  Metadata     // sent back with the reply; interceptors may set keys

	tensors []*tensor.Dense // the argument's, as they travelled
	agent   *Agent
	result  pending // the result's encoding once ResultTensors made it
}

// Tensors returns the tensors the argument arrived with, each once, in the
// order they travelled (the caller's ClientCall.Tensors, in the same
// order).
func (c *ServerCall) Tensors() []*tensor.Dense { return c.tensors }

// ResultTensors returns the tensors that the result v carries back, each
// once, in the order they will travel (the caller's Response.Tensors, in
// the same order). It encodes v as it stands, and the reply sends that
// encoding when the handler chain returns that very v (an error is the one
// the reply would fail with).
func (c *ServerCall) ResultTensors(v any) ([]*tensor.Dense, error) {
	e := c.result.get(c.agent, c.From, v)
	return e.enc.Tensors(), e.err
}

// Handler serves an incoming call; the innermost one runs the registered
// function.
type Handler func(ctx context.Context, call *ServerCall) *Future[any]

// ServerInterceptor wraps incoming calls, like ClientInterceptor.
type ServerInterceptor func(ctx context.Context, call *ServerCall, next Handler) *Future[any]

func chainClient(ics []ClientInterceptor, final Invoker) Invoker {
	h := final
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], h
		h = func(ctx context.Context, c *ClientCall) *Future[*Response] { return ic(ctx, c, next) }
	}
	return h
}

func chainServer(ics []ServerInterceptor, final Handler) Handler {
	h := final
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], h
		h = func(ctx context.Context, c *ServerCall) *Future[any] { return ic(ctx, c, next) }
	}
	return h
}

type ctxKey int

const (
	callerKey ctxKey = iota
	metaKey
	agentKey
)

// CallerFromContext returns the worker whose call a handler is serving.
func CallerFromContext(ctx context.Context) (WorkerInfo, bool) {
	w, ok := ctx.Value(callerKey).(WorkerInfo)
	return w, ok
}

// MetadataFromContext returns the metadata sent with the call a handler is
// serving (nil outside a handler).
func MetadataFromContext(ctx context.Context) Metadata {
	md, _ := ctx.Value(metaKey).(Metadata)
	return md
}

// AgentFromContext returns the agent serving the call a handler runs in, so
// that handlers registered before Init can make calls of their own.
func AgentFromContext(ctx context.Context) *Agent {
	a, _ := ctx.Value(agentKey).(*Agent)
	return a
}
