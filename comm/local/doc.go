// Package local is the in-process backend of comm: ranks are goroutines of one
// process that exchange messages through memory. It serves tests, examples and
// single-machine experiments, and is the reference implementation of the
// transport.Transport contract (ordering per peer and tag, buffering of
// messages that arrive before their receive, Abort telling peers, Close).
//
// The quickest start is NewGroups, which returns one comm.ProcessGroup per
// rank:
//
//	pgs, err := local.NewGroups(ctx, 4)
//	for r, pg := range pgs {
//		go func() { pg.AllReduce(ctx, grads[r], comm.Sum).Wait(ctx) }()
//	}
//
// NewTransports returns the bare transports. The package also registers the
// backend "local" with comm: its Connect joins ranks that share a
// comm/store.Store within one process.
package local
