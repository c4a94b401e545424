// Package data feeds training loops: data sets, samplers that order and shard
// them, and a Loader that assembles batches ahead of time on background
// goroutines.
//
// A [Dataset] writes example i's features straight into a row of the batch
// being built (no per-example allocation) and returns its class label.
// [InMemory] holds a whole set in one []float32; [LoadIDX] and [FashionMNIST]
// build one from MNIST-format IDX files (gzip or not).
//
// A [Loader] cuts an epoch's index order into batches of a *tensor.Dense of
// features, [B, example shape...], and a *tensor.Dense of int64 labels, [B]:
//
//	train, err := data.FashionMNIST(ctx, "train", data.Flatten())
//	sampler, err := data.NewDistributedSampler(train.Len(), worldSize, rank, data.Shuffle(seed))
//	loader, err := data.NewLoader(train, 64, data.WithSampler(sampler), data.Prefetch(4))
//	for epoch := range epochs {
//		for batch, err := range loader.Epoch(ctx, epoch) {
//			if err != nil { ... }
//			// batch.X, batch.Y
//		}
//	}
//
// Data that is not images with class labels (several inputs, float targets
// for regression, integer ids, any element type) is a [TensorSet]: each
// example is several named tensors. [TensorDataset] holds one in memory, as
// PyTorch's TensorDataset does, and [NewTensorLoader] serves it through the
// same samplers and prefetching as NewLoader, each [Batch] carrying one
// tensor per field (Batch.Tensors, Batch.Names, Batch.Tensor(name)):
//
//	ds, err := data.NewTensorDataset([]string{"query", "item", "y"}, q, it, y)
//	loader, err := data.NewTensorLoader(ds, 64, data.WithSampler(sampler))
//	for batch, err := range loader.Epoch(ctx, epoch) {
//		// batch.Tensor("query"), batch.Tensor("item"), batch.Tensor("y")
//	}
//
// Leaving the range loop early, cancelling ctx, or calling Close on an [Iter]
// stops the background goroutines and waits for them: nothing leaks.
//
// The index order of an epoch comes from a [Sampler]: sequential, shuffled by
// a seeded permutation that changes with the epoch, or a
// [DistributedSampler] that gives each of several replicas its own shard,
// with PyTorch's padding and drop_last rules.
package data
