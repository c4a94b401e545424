// Package ddp is Tandem's DistributedDataParallel: it trains one replica of a
// model on every rank of a process group, each on its own share of the data,
// and keeps the replicas identical by averaging their gradients after every
// backward pass. The averaging is bucketed and overlapped with the backward
// pass exactly as PyTorch's c10d Reducer does it, and the arithmetic matches
// PyTorch's to the last bit where float64 allows (see "Numerics"). The
// model is a models.Module (New) or a gorgonia graph of the user's own
// (NewGraph; see "DDP over a gorgonia graph").
//
// # Use
//
//	pg, err := comm.InitFromEnv(ctx)                       // one process per rank
//	model, err := models.NewMLP([]int{784, 256, 10})
//	net, err := ddp.New(ctx, pg, model, ddp.BucketCapMB(25))
//	opt, err := optim.NewSGD(net.Parameters(), optim.LR(0.1), optim.Momentum(0.9))
//	for batch, err := range loader.Epoch(ctx, epoch) {     // data.DistributedSampler shards the set
//		loss, err := net.Step(ctx, batch.X, batch.Y)       // forward, backward, averaged Grad
//		err = opt.Step()                                  // the update, identical on every rank
//	}
//	fmt.Println(net.Stats())                              // buckets, bytes, overlap
//
// New checks that every rank built the same model (names, dtypes, shapes, in
// order; the error names the first difference and the ranks), copies rank
// 0's parameters and buffers to every rank, and lays out the buckets. Step
// builds the training graph for the input's shape on first use (models'
// Builder, the loss of WithLoss, gorgonia's symbolic gradient), compiles it
// with the graph package's executor, and from then on runs it: forward,
// backward, and, from inside the backward pass, the reduction of each
// bucket as soon as its gradients are ready. It returns once every bucket is
// reduced, with each parameter's Grad holding the averaged gradient; the
// optimizer's Step comes next.
//
// # DDP over a gorgonia graph
//
// A program that builds its own gorgonia graph, rather than a
// models.Module, gets the same DDP from NewGraph. It names the graph's
// loss and learnable nodes (and the gradient nodes G.Grad returned, or
// leaves NewGraph to call G.Grad); a step feeds the inputs by name or by
// node, and a gorgonia Solver or a Tandem optimizer updates the weights:
//
//	grads, err := G.Grad(loss, w1, w2)
//	net, err := ddp.NewGraph(ctx, pg, ddp.GraphSpec{Graph: g, Loss: loss, Params: G.Nodes{w1, w2}, Grads: grads})
//	solver := G.NewAdamSolver(G.WithLearnRate(1e-3))
//	for ... {
//		l, err := net.Step(ctx, ddp.ByName{"x": xb, "y": yb}) // or ddp.ByNode{x: xb, y: yb}
//		err = net.Apply(solver)                             // or optim.NewAdam(net.Params(), ...).Step()
//	}
//
// NewGraph checks that every rank built the same graph: the learnable
// nodes (names, dtypes, shapes, in order; an error names the first that
// differs) and every node's op, dtype and shape in execution order (an
// error names the first node that differs and the two ranks). It copies
// rank 0's values of the learnable nodes (and of GraphSpec.Buffers) to
// every rank and lays out the buckets as New does, the last learnable node
// first.
//
// Any number of inputs, outputs and losses: GraphSpec.Inputs lists the
// nodes fed at every step (by default every variable that is neither
// learnable nor a buffer); variables outside the lists keep their values,
// which lets a second graph read a first model's weights through shared
// tensors (the generator step of a GAN, with a GraphDDP per model over one
// group). A feed that is missing, unknown, learnable or of another dtype or
// shape than its node is an error naming the node. The loss is whatever
// scalar node the user names, several losses being summed in the graph
// (G.Add); after a step every node's value is bound to it (node.Value()) until the
// next step, so other losses and outputs are read from their nodes.
//
// Executors: by default the graph runs on Tandem's graph executor, whose
// gradient hooks hand each gradient to its bucket the moment it is computed,
// so buckets are all-reduced while the backward pass goes on (overlap;
// Stats.BucketsOverlapped counts the buckets that started before it ended).
// WithTapeMachine runs it on gorgonia's TapeMachine instead, which has no
// hooks: every bucket is reduced after the backward pass, with no overlap,
// and the same result.
//
// Where the gradients land: NewGraph binds a dual value to every learnable
// node, and each synchronized step leaves the averaged gradient in it, so
// node.Grad() returns it (what gorgonia's solvers read and zero), and
// Params()[i].Grad is the same tensor (what Tandem's optimizers read).
// Apply runs a gorgonia Solver with checks: a node that is not one of the
// DDP's learnable nodes, or whose gradient has not been reduced since its
// last update (after a NoSync step, say), is refused with an error naming
// it. ParamsOf gives the models.Params of some nodes, for an optimizer over
// part of the model; it refuses unknown nodes the same way.
//
// The reducer by hand: Step is Prepare, Pass.Run and Pass.Finish, which a
// custom loop may call itself, in the spirit of c10d's Reducer
// (prepare_for_backward, the autograd hooks, finalize_backward). Prepare
// broadcasts the buffers and arms the buckets; Run feeds the inputs and
// runs forward and backward, starting each bucket's reduction from the
// gradient hooks; between Run and Finish the loop reads outputs and losses;
// Finish waits for every bucket; after it the loop may inspect or clip the
// averaged gradients (the same on every rank) before the update. A loop
// that drives its own executor (its own TapeMachine, say) runs it between
// Prepare and Finish instead of Run; Finish then reads each gradient from
// its gradient node and reduces after the run. NoSync accumulates: passes
// inside it add this rank's gradients into the buckets without
// communicating, and the next synchronized pass reduces the sum. Join
// lets ranks run different numbers of steps, as for New.
//
// gorgonia's BindDualValues adds every run's gradient to the node's dual
// value, so a dual value can hold the sum of several runs; averaging that
// sum silently trains the wrong model. DDP never reads a gradient from a
// dual value: it reads each run's own gradient from the gradient nodes and
// overwrites the dual value with the reduced one. Finish refuses, naming
// the node, a dual value that holds anything but nothing or the run's
// gradient (the graph ran twice in one pass): accumulation goes through
// NoSync.
//
// Gorgonia graphs have fixed shapes: a batch of another size (the short
// last batch of an epoch) needs a graph and a GraphDDP of its own, or is
// dropped. Learnable nodes must hold tensors (a scalar parameter is a
// tensor of shape (1)) and keep them: a value replaced with G.Let after
// NewGraph is an error naming the node, since DDP and optimizers update
// the tensor in place.
//
// # Buckets
//
// Gradients are reduced in buckets: contiguous buffers of one dtype that
// hold every parameter's gradient, so that a few large collectives replace
// many small ones. The initial layout walks the
// parameters in reverse order (the order in which a feed-forward network's
// gradients appear) and closes a bucket once it reaches its cap: the first at
// FirstBucketCapMB (1 MiB by default, or BucketCapMB when smaller), the others
// at BucketCapMB (25 MiB by default); the parameter that crosses a cap still
// joins the bucket, and dtypes never share one. After the first step the
// buckets are rebuilt once, in the order rank 0 saw the gradients become
// ready, which rank 0 broadcasts so that every rank agrees. Buckets returns the
// layout.
//
// Parameters' Grad tensors are views of the buckets (PyTorch's
// gradient_as_bucket_view), and the backward pass computes the gradients of
// Linear, Conv2d, BatchNorm2d and LayerNorm parameters straight into those
// views (models.Builder.SetGradTarget): no copy into the bucket before the
// reduction, none back after it. Gradients of other ops, and those of a
// step that follows NoSync steps, are added into the views from buffers of
// their own; Stats counts both kinds. A parameter's Grad stays nil until a
// step in which some rank used it.
//
// With every rank on one host the buckets are comm's shared tensors
// (comm.ProcessGroup.NewSharedTensor; SharedBuckets, on by default): memory
// every rank maps, so gradients are computed where the peers read them and
// each bucket's all-reduce runs in place there, without the transport.
// Where /dev/shm has no room for them, or ranks span hosts, the buckets are
// ordinary memory and go through the transport.
//
// # Overlap
//
// The graph executor calls a hook the moment a parameter's gradient is
// final; the hook marks it ready in its bucket and, when the bucket
// is complete and every earlier bucket has gone out, hands it to the comm
// hook, which starts an asynchronous all-reduce while the backward pass goes
// on. Buckets go out strictly in order, so every rank issues its collectives
// in the same order. Stats tells how much of the communication time was
// hidden behind the backward pass, and how many buckets started before it
// ended; it times the forward pass (up to the loss) and the backward pass
// apart (ForwardTime, BackwardTime), and metrics.DDP serves all of these.
//
// # Numerics
//
// With no comm hook, each gradient is multiplied by 1/world as it is
// computed into its bucket (the matrix product's alpha, for Linear) or
// copied there, and the buckets are summed across the ranks: PyTorch's
// built-in reduction (bit for bit for power-of-two world sizes; for others
// the multiply inside the matrix product may round differently from
// PyTorch's separate one, in the last bit). AllReduceHook
// divides the bucket by the world size first instead, as PyTorch's Python
// allreduce_hook does (the two differ in the last bit for world sizes that
// are not powers of two). The parity test trains a PyTorch fixture on two
// ranks and matches every loss and every final weight to 1e-9 relative (in
// practice to a few ulps; the matrix products differ from PyTorch's BLAS in
// summation order, the reduction itself does not).
//
// # Communication hooks
//
// WithCommHook replaces the reduction of each bucket: AllReduceHook,
// FP16CompressHook and BF16CompressHook (half the bytes: an all-reduce of a
// float16 or bfloat16 tensor, summed in float32 and rounded once), PowerSGDHook (low-rank compression
// with error feedback, after a number of plain iterations), or a function of
// one's own, given the GradBucket (Index, Buffer, Gradients, Parameters,
// IsLast, SetBuffer) and returning a Future of the reduced buffer.
//
// # Gradient accumulation, unused parameters, uneven inputs
//
// NoSync runs steps that only accumulate local gradients; the next Step
// reduces the sum once. FindUnusedParameters allows parameters that do not
// take part in a step's loss (marked ready at once with a zero gradient);
// StaticGraph does the same for a set known to be fixed, exchanging the
// used-parameter map only once. BroadcastBuffers (on by default) copies rank
// 0's buffers, such as batch-norm running statistics, to every rank before
// each step. Join lets ranks with fewer batches stop early: they shadow the
// others' collectives with zero gradients until every rank is done.
//
// # Synchronized batch normalization
//
// SyncBatchNorm normalizes with the statistics of the global batch, all
// ranks' examples together, through the differentiable collectives of
// ops/dist, so its gradient is exact as well; ConvertSyncBatchNorm swaps it
// in for every BatchNorm2d of a Sequential model, on a group of its own.
//
// # Stragglers and debugging
//
// Every StragglerEvery synchronized steps (20 by default) the ranks
// exchange the mean of their own step times (the time each spent outside
// DDP's waits for its peers) with one small all-gather; Stats.Stragglers
// names the slowest rank and its factor over the median, and rank 0 logs it
// (at most once a minute) when it is 1.5 times the median or more. At the
// debug level INFO (TANDEM_DEBUG, comm.WithDebugLevel) rank 0 logs the
// bucket layout when it is made and when it is rebuilt.
//
// WithTimeline records a window of steps as Chrome-trace events, as
// Horovod's timeline does: per step the forward pass (to the loss), the
// backward pass, each bucket's all-reduce on a lane of its own (with its
// index and bytes), the wait for the reductions, and spans the training
// loop adds with Timeline.Span (the optimizer's step). Timestamps are
// wall-clock microseconds, so ranks on one host line up; across hosts only
// as well as their clocks agree. Timeline.Gather collects every rank's
// events on one rank, MergeTimelines (and `tandem timeline`) merges the
// files the ranks wrote; either gives one trace, a process per rank, for
// chrome://tracing or ui.perfetto.dev. Off (the default) it costs a nil
// check per step. GraphDDP under TapeMachine, which does not say when the
// loss is ready, records its runs as one forward+backward event.
//
// # Where this differs from PyTorch
//
//   - Gradients are overwritten, not accumulated: every synchronized Step
//     leaves this step's averaged gradient (plus what NoSync steps
//     accumulated) in Grad, so zeroing the gradients between steps is not
//     needed (and harmless).
//   - PyTorch 1.13 reduces its first iteration in a single bucket unless
//     find_unused_parameters is set, and caps the first bucket at 1 MiB even
//     when bucket_cap_mb is smaller; here the first step already uses the
//     size-capped layout, and the first cap is min(1 MiB, BucketCapMB) unless
//     FirstBucketCapMB says otherwise. The rebuild after the first step
//     happens in both.
//   - Inside Join the buffers are broadcast from the lowest rank still
//     training, and the final model from the lowest of the last ranks to
//     join (PyTorch picks the highest).
//   - FP16CompressHook and BF16CompressHook all-reduce 16-bit tensors whose
//     sum is taken in float32 and rounded to 16 bits once; PyTorch over gloo
//     rounds every partial sum of its ring. With two ranks the results are
//     the same bits; with more, these are the more accurate.
//
// # Not built yet
//
//   - GraphDDP has no SyncBatchNorm: it works with New over a
//     models.Module only.
//   - GraphDDP computes gradients straight into the buckets only under
//     Tandem's graph executor, in synchronized passes that do not add to
//     NoSync's sums, and for gradient nodes that no other node reads (see
//     GraphDDP.GradNode); the rest, and every gradient under TapeMachine,
//     are copied in. The reduced gradient is copied once more into the
//     tensor node.Grad() returns, which stays the same tensor from step to
//     step.
//   - Under TapeMachine, Step ignores its context while the graph runs
//     (gorgonia's RunAll takes none); the reductions honour it.
//   - GraphDDP compiles the whole graph: nodes that neither the loss nor its
//     gradients need (a metric) run at every step too.
//   - One GraphDDP per graph: two models trained in turn over one graph
//     (both backward passes in one ExprGraph) need a graph each, sharing
//     weights by tensor.
//
// # Failure
//
// Every blocking call takes a context. A Step that fails on one rank (a
// lost peer, a timeout, an error in the model) leaves the ranks out of step,
// so DDP aborts the process group: the other ranks' steps fail promptly with
// comm.ErrPeerLost instead of waiting for their timeouts, and the DDP
// refuses further steps with ErrClosed.
package ddp
