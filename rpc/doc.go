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
//	defer agent.Shutdown(ctx)
//
// InitFromEnv reads this process's place in the job through package launch,
// by the rules comm.InitFromEnv uses (tandem run, torchrun, Kubeflow,
// Kubernetes indexed Jobs, Open MPI, PMI, Slurm; its errors name the
// launcher detected and the fix), and meets the others through a TCP store
// at MASTER_ADDR:MASTER_PORT (rank 0 serves it). Under torchrun's static
// rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) every worker joins the
// PyTorch TCPStore that torchrun's agent serves there instead, under torch's
// "/worker/attempt_N" prefix; that store cannot check a token (a warning
// says so when one is set), while the agents' own connections still prove
// it. Init takes rank and world size explicitly, and WithStore passes a
// store already open (one shared with a process group, say).
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
// Remote references (package rref, installed with
// rpc.WithExtensions(rref.Extension())) build on this: rref.Remote creates
// a value on another worker and returns a reference at once.
//
// Every call has a timeout: WithTimeout, else the agent's default
// (DefaultTimeout, WithDefaultTimeout), and the context's deadline. A call
// that fails returns a *CallError, as net's operations return a
// *net.OpError: it names the operation, the worker and the function, and
// wraps the cause, which errors.Is tells apart: ErrUnknownFunction (naming
// the registered ones), ErrWrongType (naming expected and received types),
// ErrRemote (a *RemoteError with the function's error message; ErrPanic
// with the trimmed stack when it panicked: the callee keeps serving; and
// any shared sentinel the remote error wrapped), ErrPeerLost (the worker
// died, is unresponsive, or is unreachable), ErrTimeout (with
// context.DeadlineExceeded when the context's deadline passed),
// context.Canceled, ErrClosed.
//
// # Transport
//
// Each ordered pair of workers shares one TCP connection (TLS with WithTLS)
// that carries many calls at once: frames are length-prefixed and tagged
// with a call id (the layout: internal/wire), one goroutine reads each
// connection, a sync handler starts on the goroutine that read its call
// (reading passes to a new goroutine), async handlers run without a
// goroutine of their own, and concurrent writers coalesce their frames into
// one writev. Tensors are written from their own memory and read into the
// new tensor's memory, which is not zeroed first.
//
// Between workers on the same machine, frames whose tensors hold 256 KiB or
// more go by reference: the receiver copies the tensors straight out of the
// sender's memory (Linux process_vm_readv, internal/samehost: one copy
// instead of the socket's two) and acknowledges; the call, or the reply,
// goes on once the copy is made, so the sender may change its tensors
// afterwards exactly as over TCP. A Sync call skips the acknowledgement:
// its caller waits for the reply anyway, which comes only after the callee
// has copied the argument, and the call keeps the tensors reachable until
// then (if the call times out or its context ends first, the callee may
// still be reading them). Each connection checks at its handshake that
// this works (same kernel boot, and the peer's memory readable: ptrace
// rules, no seccomp filter forbidding it) and otherwise sends everything
// inline; WithSameHostCopy(false) turns it off. The process read is the
// one the kernel names as the peer (each side proves which process it is
// through an abstract Unix socket, see internal/peercred), never one the
// peer names, and only if it runs as the same user. Copies of 2 MiB and
// more are shared between the receiving goroutine and a helper, so they use
// a second core where one is free.
//
// Where both ends copy each other's memory, tensors of 1 MiB or more are
// also pushed (WithPush): the receiver of a large tensor grants the sender
// memory for the next one of that size (a receive buffer and a completion
// word), and the sender, which would otherwise wait for the copy, writes
// the tensor into that memory itself (process_vm_writev) from the end,
// once the frame is sent, while the receiver copies it from the start;
// they meet where they meet, in pieces of 256 KiB, so a side that is slowed
// leaves more to the other in the same call. The copy runs on two cores,
// even with one processor a process. Only memory the receiver granted is
// written, by the process the kernel named; granted memory is never reused
// until the sender is known to be done with it (a grant outstanding when a
// connection fails is held back until its completion word is set or the
// sender's process is gone). A call that lends memory for its reply
// (WithResultInto) gets the reply there, not pushed.
//
// On connections to workers of the same host, a read loop that finds no
// bytes polls the socket for up to 50 µs (WithPoll), yielding the processor
// between looks, before it parks on the network poller: waking a parked
// goroutine costs tens of microseconds on virtual machines, more than a
// small call's whole round trip (4 B echo: 14 µs polling, about 70
// parking). A wait of up to 2 ms has the next poll last twice as long (at
// most 2 ms), so that the reply to a large call, which comes once the peer
// has copied the tensors, finds the reader still polling: the 4 MiB echo's
// median went from 1.04-1.21 ms to 0.77-0.83. Connections to other hosts
// and over TLS park at once.
//
// Memory for large received tensors (256 KiB and up) is recycled: fresh
// memory costs a page fault per 4 KiB page on first touch, and every few
// megabytes allocated start a garbage collection; together they cost more
// than the copy itself. Each such tensor's memory carries a finalizer that,
// once nothing refers to the tensor or any slice of its data, puts it on a
// process-wide free list (64 MiB at most, making room for the sizes
// received lately) for the next tensor of its size class (sizes are
// rounded up by at most a quarter); a tensor kept by user code is never
// reused. A receive that finds the free list of its size empty also has
// two buffers of that size made in the background, their pages mapped
// there (MADV_POPULATE_WRITE), so that the receives after it skip the page
// faults. Fresh buffers of 2 MiB or more start on a 2 MiB boundary and are
// advised to use transparent huge pages (two faults for 4 MiB instead of a
// thousand, and faster copies out of them).
//
// Loops that move large tensors again and again can skip the collector on
// both sides. A caller lends memory for the result with WithResultInto (the
// reply is copied into the tensor it passes, as append reuses an array),
// and a function registered with ReuseArgMemory promises to keep nothing of
// its argument, so the agent puts the argument's buffer back on the free
// list, on top, as soon as the reply has gone. The next copy then writes
// into memory used a moment ago, which is still in the CPU's caches: a
// copy into cold memory runs at the machine's memory bandwidth, a copy
// into warm memory several times faster. On the 2-core development machine
// a 4 MiB echo takes about 1.0 ms that way against about 1.8 ms the plain
// way.
//
// # Design notes on large tensors
//
// PyTorch's TensorPipe agent moves CPU tensors between processes of one
// machine the same way (its "cma" channel: the receiver reads the sender's
// memory with process_vm_readv, then acknowledges). Its edge is memory:
// tensors are reference counted, so a received tensor is freed the moment
// the program drops it and the allocator hands the same, already mapped
// memory to the next one. Here only the collector can tell that a tensor
// is no longer used, so buffers come back one collection late, and a
// receive that finds the free list empty takes fresh memory (on a 2-core
// machine under load, a 4 MiB echo round trip costs about 1.3 ms with
// recycled buffers on both sides and about 2.2 ms with fresh ones), and the
// recycled buffers, a collection's worth of them in turn, are no longer in
// the caches. WithResultInto and ReuseArgMemory are the way around it for
// code that can say when memory is free. Tried
// and left out, as they bought nothing measurable there: sending the
// read-done frame of a reply with the caller's next request; splitting a
// copy between two threads; copying with raw system calls in 1 MiB pieces
// (the runtime's thread switches around long system calls stayed);
// starting a collection when the free list runs dry (more CPU than the
// page faults it saved); refilling a free list before it is empty; free
// lists larger than 64 MiB.
//
// # Liveness
//
// Every connection proves its peer alive. Each side sends a small
// heartbeat frame whenever it has written nothing for the liveness interval
// (a third of the liveness timeout, at most a second), and any bytes
// received count as life. A worker that sends nothing for the liveness
// timeout (5 s by default, WithLivenessTimeout; negative turns the check
// off) is unresponsive: it was stopped, is frozen or swapped out, or the
// link to it is cut; its kernel may well still acknowledge every byte, so
// TCP alone cannot tell. Its connections are failed: the calls waiting on
// it end with ErrPeerLost and a message saying that it is unresponsive and
// since when (not when the call's own timeout ends, 60 s by default), and
// the handlers serving it see their context cancelled. The same timeout is
// set as TCP_USER_TIMEOUT on Linux, so that a write left unacknowledged
// fails as well, and connecting to a worker, handshake included, is bounded
// by twice it. Every worker of a group should use the same setting.
//
// Both ends of every connection prove that they hold a shared token
// (WithToken, TANDEM_TOKEN, or one the workers create through the store when
// neither is set) by a challenge-response with fresh nonces on both sides
// (internal/tokenauth): the token never crosses the wire, a recorded
// handshake does not open another connection, and a listener that does not
// hold the token is refused by the caller. A wrong token is refused at the
// handshake with ErrUnauthorized; workers of different RPC protocol versions
// refuse each other naming the versions. Until a connection has proved the token
// it gets a small read buffer and five seconds, and at most 256 such
// connections (64 from one host) are served at once; more are closed as
// soon as they are accepted, and the warnings about them are
// rate-limited, so a flood of idle connections costs little memory and
// few log lines. A frame over the size limit
// (WithMaxMessageSize) or malformed closes that connection only; the agent
// keeps serving the others.
//
// # Extending
//
// Client and server interceptors (WithClientInterceptor,
// WithServerInterceptor, UseClient, UseServer) see every call with its
// decoded argument and result, and per-call Metadata both ways; the
// Tensors of ClientCall, ServerCall and Response (and ServerCall.ResultTensors)
// list a message's tensors in its frame's order, the same on both sides.
// Distributed autograd builds on these to record sends and receives. Packages such as rref and distributed autograd
// are extensions (Extension) that an agent installs only when asked:
//
//	agent, err := rpc.InitFromEnv(ctx, "trainer", rpc.WithRegistry(reg),
//		rpc.WithExtensions(rref.Extension(), autograd.Extension()))
//
// Linking a package in installs nothing. An extension installs its
// functions, interceptors and hooks (OnShutdown, OnClose) at Init and
// keeps its per-agent state there (Agent.Extension); it runs functions
// locally with CallLocal, and starts its background work with Go, which
// ties the goroutine to the agent's lifetime: a graceful shutdown waits
// for it, and closing cancels and waits for it. Registering the same
// function twice under one name is no error (agents sharing a registry
// each install their extensions); two different functions under one name
// are.
//
// # Observing
//
// Agent.Metrics counts calls and requests by outcome, those in flight, and
// the latencies of calls (package metrics serves them to Prometheus). The
// debug level (TANDEM_DEBUG or TORCH_DISTRIBUTED_DEBUG, or WithDebugLevel)
// adds log lines on the agent's logger: at INFO the rendezvous (the
// workers that met, the world size and how long it took), at DETAIL also
// every call the agent makes (callee, function, duration, error) and every
// request it serves. The agent keeps no flight record of its calls as
// process groups do of their collectives: calls have no order that every
// worker shares, so there is no operation that one worker did not reach
// for a merged record to point at; the DETAIL log and the metrics say what
// a record would.
//
// # Ending
//
// Shutdown(ctx) waits until all outstanding work on all workers is done,
// then closes (PyTorch's rpc.shutdown(graceful=True)); Close closes at once
// (graceful=False). A graceful
// shutdown is bounded by its context alone (a parameter server that calls
// it at once waits there for as long as its trainers train), and it
// watches the workers it waits for: one that dies, exits without shutting
// down or stops answering, or the loss of the store's host, ends it within
// seconds with ErrPeerLost naming the worker. When the context's deadline
// passes first, the error names the workers still missing and says which
// of them are alive.
package rpc
