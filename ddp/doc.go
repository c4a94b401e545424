// Package ddp is Tandem's DistributedDataParallel: it trains one replica of a
// model on every rank of a process group, each on its own share of the data,
// and keeps the replicas identical by averaging their gradients after every
// backward pass. The averaging is bucketed and overlapped with the backward
// pass exactly as PyTorch's c10d Reducer does it, and the arithmetic matches
// PyTorch's to the last bit where float64 allows (see "Numerics").
//
// # Use
//
//	pg, err := comm.InitFromEnv(ctx)                       // one process per rank
//	model, err := models.NewMLP([]int{784, 256, 10}, models.ActReLU, true, nil)
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
// # Overlap
//
// The graph executor calls a hook the moment a parameter's gradient is
// final; the hook marks it ready in its bucket and, when the bucket
// is complete and every earlier bucket has gone out, hands it to the comm
// hook, which starts an asynchronous all-reduce while the backward pass goes
// on. Buckets go out strictly in order, so every rank issues its collectives
// in the same order. Stats tells how much of the communication time was
// hidden behind the backward pass, and how many buckets started before it
// ended.
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
// FP16CompressHook and BF16CompressHook (half the bytes, sums rounded in
// half precision as PyTorch's hooks do), PowerSGDHook (low-rank compression
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
//   - FP16CompressHook and BF16CompressHook sum in ring order over
//     point-to-point messages (collectives here carry no 16-bit types); the
//     rounding after each addition is PyTorch's, the order of the additions
//     is gloo's ring order only by design, not bit for bit.
//
// # Failure
//
// Every blocking call takes a context. A Step that fails on one rank (a
// lost peer, a timeout, an error in the model) leaves the ranks out of step,
// so DDP aborts the process group: the other ranks' steps fail promptly with
// comm.ErrPeerLost instead of waiting for their timeouts, and the DDP
// refuses further steps with ErrClosed.
package ddp
