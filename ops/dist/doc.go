// Package dist makes Tandem's collectives differentiable: each function
// builds a gorgonia node that runs a collective of a comm.ProcessGroup when the
// graph runs, and whose gradient (gorgonia.Grad) is built from collectives as
// well, with the exact backward rule. It answers PyTorch's
// torch.distributed.nn.functional, with its gaps filled: every reduce op has
// its gradient except the bitwise ones.
//
// # Use
//
// Every rank builds the same graph; the collective nodes connect the ranks'
// graphs when they run:
//
//	g := gorgonia.NewGraph()
//	x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(4, 8), gorgonia.WithName("x"))
//	y, err := dist.AllReduce(pg, x, comm.Sum)          // sum over the ranks
//	parts, err := dist.AllGather(pg, x)                // one node per rank
//	loss := ...                                        // this rank's loss
//	grads, err := gorgonia.Grad(loss, x)               // backward collectives included
//	prog, err := graph.Compile(g, graph.WithGrads(gorgonia.Nodes{x}, grads))
//	err = prog.Run(ctx, graph.Bind(x, batch))          // or gorgonia's TapeMachine
//
// The functions are Broadcast, Reduce, AllReduce, AllGather,
// AllGatherIntoTensor, Gather, Scatter, ReduceScatter, ReduceScatterTensor,
// AllToAll and AllToAllSingle. Their arguments follow PyTorch's, with one
// difference: roots and ranks are ranks of the group (0 to pg.Size()-1),
// where torch.distributed takes global ranks even on a subgroup. On a
// subgroup, pass the root's position in the group; pg.Ranks() lists the
// members' global ranks in group order (pg.WorldRank converts one). Functions with one output per rank (AllGather,
// Gather, AllToAll) return one node per rank: each is a block of one stacked
// node of shape [world, ...] that a single collective fills. A block's
// gradient is placed into zeros of the stacked shape, and gorgonia adds the
// placed gradients up, which is exact: every element receives one term, the
// others being zeros. Functions with one input per rank (Scatter,
// ReduceScatter, AllToAll) take a list of nodes, one op node reading them all;
// Scatter, like PyTorch's, takes the list on every rank, where off the source
// rank it only gives the output's shape.
//
// Tensors may have any shape, scalars included, and any dtype comm moves
// (float32, float64, int8, uint8, int32, int64); gradients exist for float32
// and float64. Empty tensors are refused, as gorgonia cannot hold them.
//
// The executor of package graph runs these nodes with the run's context
// (they implement its ContextDoer): a cancelled run, a dead peer or a
// timeout ends them with an error wrapping comm's sentinels. gorgonia's
// TapeMachine runs them too, bounded by the group's default timeout.
//
// Ranks that are goroutines of one process (comm/local, tests) should build
// their graphs one after the other and only run them concurrently: gorgonia
// shares a few constant nodes between all graphs (the 1 that gorgonia.Grad
// seeds the backward pass with, for one) and caches their hashes on first
// use without synchronisation.
//
// # Gradients accumulate in dual values
//
// gorgonia's TapeMachine option BindDualValues, and graph.BindDualValues
// which copies it, add each run's gradient to what the node's dual value
// (n.Grad()) already holds. gorgonia's solvers zero the dual values after
// their step, so a loop that runs the graph and then a solver step sees one
// run's gradient. A loop that reads n.Grad() itself, runs the graph twice
// before a step, or averages the gradients over the ranks by hand, gets the
// sum of every run since the last zeroing: dividing that by the world size
// trains the wrong model, silently. The gradients these functions build are
// already exact (an all-reduce of the output gradients for sum, and so on:
// see below); read them from the gradient nodes (graph.WithGrads), or zero
// the dual values before each run.
//
// # Semantics of the gradients
//
// The objective is the sum of every rank's loss. Outputs a rank does not
// receive (the non-roots of Reduce and Gather) are zeros and carry no
// gradient. Sum, avg and premul_sum are linear: the gradient of an all-reduce
// with one of them is the all-reduce of the output gradients with the same op.
// Product's gradient is the product of the other ranks' values (computed
// with prefix and suffix products from the inputs that an extra all-gather,
// or for reduce-scatter an all-to-all, brings: exact with zeros, no
// division). Max and min send the gradient to every rank
// holding the extreme value, split equally among ties. Band, bor and bxor
// take integer tensors; asking for their gradient, or for any gradient of an
// integer collective, fails in SymDiff with an error that names the op and
// the reduce op and wraps ErrNotDifferentiable (gorgonia.Grad passes the
// message on but not the wrapping). The rules of every function are listed
// in backward.go and in each function's documentation. The gradients of
// product, max and min are computed by backward nodes that have no gradient
// of their own: second derivatives through them are refused.
//
// # Order of collectives
//
// Ranks match collectives by their order, and a parallel executor could start
// two independent collective nodes in different orders on different ranks.
// So the collective nodes of one group in one graph form a chain: each node
// takes the previous one as an extra input that only orders them (it has no
// gradient). Every executor then issues them in the order they were built, on
// every rank, which also covers the backward collectives gorgonia.Grad adds.
// Ranks must build the same collectives in the same order, as in any SPMD
// program. Each node's hash includes its group and its place in the chain, so
// gorgonia never merges two collectives on the same input into one node.
package dist
