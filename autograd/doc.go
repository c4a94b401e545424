// Package autograd is Tandem's distributed autograd: a backward pass that
// crosses RPC boundaries, so that a model split over several workers
// (model or pipeline parallelism) trains as if it were one, plus the
// optimizer and the remote module that go with it (what PyTorch's
// torch.distributed.autograd, DistributedOptimizer and RemoteModule do).
//
// An agent takes part only when asked: start every worker with
//
//	agent, err := rpc.InitFromEnv(ctx, "worker1", rpc.WithRegistry(reg),
//		rpc.WithExtensions(autograd.Extension()))
//
// which installs the protocol, the interceptors that record sends and
// receives, and remote references (package rref), which it needs. Linking
// the package in installs nothing; on an agent started without it, this
// package's functions fail with ErrInvalidArgument saying so. Closing the
// agent drops the contexts still open on it.
//
// # Contexts
//
// A distributed autograd context groups the forward and backward pass of
// one iteration. Its id is unique in the group (the owner's worker id in
// the high bits, a counter in the low ones). Inside a context, every RPC
// whose argument carries tracked tensors records a send function on the
// caller and a receive function on the callee, and the reverse for a result
// that carries tracked tensors, so the graph spans the workers:
//
//	err := autograd.WithContext(ctx, agent, func(ctx context.Context, c *autograd.Context) error {
//		h, err := stage1.Forward(ctx, c, x)            // a RemoteModule on worker1
//		y, err := stage2.Forward(ctx, c, h)            // on worker2; h travels through here
//		out, err := lossFn.Apply(ctx, c, y, target)    // a local Function
//		if err := c.Backward(ctx, out[0]); err != nil { // reaches worker2, then worker1
//			return err
//		}
//		return opt.Step(ctx, c.ID())                   // a DistributedOptimizer
//	})
//
// Handlers reached by an RPC made inside a context find this worker's part
// of it with FromContext, and RPCs they make with their ctx are recorded
// too. WithContext ends the context afterwards on every worker it touched,
// whether fn succeeded or not.
//
// # The graph on each worker
//
// Go tensors carry no autograd history and gorgonia graphs are static, so
// each worker records a tape whose nodes are whole computations, linked by
// the identity of the *tensor.Dense values they read and produce:
//
//   - a Function (a gorgonia graph built by a BuildFunc, or a models.Module
//     with NewModuleFunction) records itself when applied in a context; its
//     backward recomputes the forward and runs the vector-Jacobian product
//     (re-materialization: only inputs are kept, any number of
//     micro-batches may be in flight);
//   - Context.Record records any other computation with a hand-written
//     BackwardFunc;
//   - the RPC interceptors record send and receive functions;
//   - Context.RequireGrad marks a leaf whose gradient is wanted.
//
// A tensor produced by one node and read by another links them; pass the
// tensors you got as they are (a copy or a view is a new, untracked
// tensor). Only tensors that a recorded node produced are tracked; an
// argument of an RPC that carries no tracked tensor records no send (the
// call still joins the callee to the context, so what it computes with its
// parameters is recorded).
//
// # Backward
//
// Context.Backward, on the owner, seeds its roots with ones and runs a pass
// on every worker that takes part (the owner learns them from the replies
// of the forward calls). Each worker processes its whole tape: a node runs
// once every consumer of each of its outputs has contributed, so a tensor
// used along several paths (an RPC result used twice, a tensor sent to two
// workers, a result used both locally and remotely) gets the sum of its
// gradients before its producer runs, and every function's backward runs
// exactly once per pass, on a goroutine of its own as soon as it is ready
// (a pipeline's stages overlap in backward as in forward). The gradient of
// every received tensor goes back to its sender as soon as it is complete;
// consumers that do not lead to a root contribute "no gradient", so every
// receive function answers its sender exactly once and no worker waits for
// a message that will not come. This is exact for any DAG, and cheaper
// than running each send function's backward as soon as its gradient
// arrives (which would run a shared producer once per path, relying on
// linearity to get the sum right).
//
// Parameter gradients accumulate in the context on the worker that holds
// the parameter (GetGradients, Context.Gradients), never in Param.Grad, so
// concurrent contexts over the same model do not interfere; repeated
// passes in one context add up.
//
// # Failures
//
// Every wait is bounded: Backward's ctx (else the agent's default timeout)
// bounds the pass on every worker. A backward function's error, a worker
// that dies, or the deadline fails the pass on every worker that takes
// part: the owner's Backward returns the first cause, and every other
// worker's part records an error wrapping ErrAborted (Context.Err). A
// forward RPC that failed makes Backward refuse to run (ErrForwardFailed).
// End releases the context on every worker it touched, after success or
// failure; workers pass the release on to those they talked to.
//
// # Optimizer and remote modules
//
// NewRemoteModule builds a module (registered with RegisterModule) on a
// remote worker; Forward and ForwardAsync run it there inside a context;
// ParameterRRefs gives its parameters as RRefs. NewDistributedOptimizer
// builds an optimizer (optim.New's names, or RegisterOptimizer) on each
// worker holding some of the parameters, and Step updates them all in
// parallel with a context's gradients.
//
// # Limits
//
// The graph is recorded per context and is not freed until the context
// ends. Tensors inside values that encode themselves by hand (an
// rpc.Marshaler that writes tensors with Encoder.Tensor) are tracked like
// any other: both ends list a message's tensors in the order of its frame. Backward runs on the owner only. A worker's part of a
// context whose owner died before ending it stays until the worker shuts
// down. Functions must be deterministic (their backward recomputes the
// forward).
package autograd
