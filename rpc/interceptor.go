package rpc

import (
	"context"
	"reflect"
	"time"

	"gorgonia.org/tensor"
)

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
}

// Response is a call's outcome as client interceptors see it: the decoded
// result and the metadata the callee sent back.
type Response struct {
	Value any
	Meta  Metadata
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
