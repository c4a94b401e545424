// Package rpc is Tandem's remote procedure call layer: every worker process
// runs an Agent that serves named functions to the others and calls theirs,
// for model parallelism, parameter servers and pipelines (what PyTorch's
// torch.distributed.rpc and its TensorPipe agent do).
//
// # Starting
//
// Register functions in a Registry (like net/http's ServeMux), then start
// one agent per process; workers meet through a store and every name must be
// unique:
//
//	reg := rpc.NewRegistry()
//	rpc.Register(reg, "scale", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
//		return x.MulScalar(float32(2), true)
//	})
//	agent, err := rpc.InitFromEnv(ctx, "worker1", rpc.WithRegistry(reg))
//	defer agent.Shutdown(ctx, true)
//
// InitFromEnv reads RANK and WORLD_SIZE and meets the others through a TCP
// store at MASTER_ADDR:MASTER_PORT (rank 0 serves it); Init takes rank and
// world size explicitly, and WithStore passes a store already open (one
// shared with a process group, say).
//
// # Calling
//
//	y, err := rpc.Sync[*tensor.Dense](ctx, agent, "worker1", "scale", x)
//	fut := rpc.Async[*tensor.Dense](ctx, agent, "worker1", "scale", x)
//	y, err = fut.Wait(ctx)
//
// Arguments and results are typed with generics and must be the same Go
// type on both sides. Tensors (*tensor.Dense) travel as raw bytes (dtype,
// shape, data) in sections of the frame, written with writev straight from
// the tensor's memory and read straight into the new tensor's; the rest of a
// value is a compact binary encoding (see Marshaler for what travels).
// Remote references (package rref) build on this: rref.Remote creates a
// value on another worker and returns a reference at once.
//
// Every call has a timeout: WithTimeout, else the agent's default
// (DefaultTimeout, WithDefaultTimeout), and the context's deadline. Errors
// come back clear and wrapped: ErrUnknownFunction (naming the registered
// ones), ErrWrongType (naming expected and received types), ErrRemote (the
// function's error message; ErrPanic with the trimmed stack when it
// panicked: the callee keeps serving), ErrPeerLost (the worker died or is
// unreachable), ErrTimeout, ErrClosed.
//
// # Transport
//
// Each ordered pair of workers shares one TCP connection (TLS with WithTLS)
// that carries many calls at once: frames are length-prefixed and tagged
// with a call id, one goroutine reads each connection, sync handlers run on
// goroutines of their own, and concurrent writers coalesce their frames into
// one writev. Every connection presents a shared token (WithToken,
// TANDEM_TOKEN, or one the workers create through the store); a wrong token
// is refused. A frame over the size limit (WithMaxMessageSize) or malformed
// closes that connection only.
//
// # Extending
//
// Client and server interceptors (WithClientInterceptor, UseServer) see
// every call with its decoded argument and per-call Metadata; distributed
// autograd uses them to record sends and receives. Packages such as rref
// attach per-agent state with Extension and RegisterExtension.
//
// # Ending
//
// Shutdown(ctx, true) waits until all outstanding work on all workers is
// done, then closes; Shutdown(ctx, false) closes at once.
package rpc
