// Package graph is Tandem's executor for gorgonia expression graphs. It takes
// the place of gorgonia's TapeMachine, which runs one node at a time and
// tells nobody when a value is ready.
//
// Compile turns a graph, including the gradient nodes gorgonia.Grad added to
// it, into a Program once; Program.Run executes it as often as needed with new
// input values:
//
//	grads, _ := G.Grad(cost, w, b)
//	prog, err := graph.Compile(g, graph.WithGrads(G.Nodes{w, b}, grads))
//	prog.OnGradReady(w, func(ctx context.Context, wrt *G.Node, grad G.Value) error {
//		// the gradient of w is final: hand it off (DDP starts a bucket's allreduce here)
//		return nil
//	})
//	for batch := range batches {
//		if err := prog.Run(ctx, graph.Bind(x, batch.X), graph.Bind(y, batch.Y)); err != nil {
//			return err // names the node and op that failed
//		}
//		loss := cost.Value()          // as after a TapeMachine run
//		gw, _ := prog.Grad(w)         // or w.Grad(), or grads[0].Value()
//	}
//
// What a run does:
//
//   - Dataflow scheduling: a node becomes runnable when all its inputs are
//     done, and up to Workers(n) runnable nodes run at once (default
//     GOMAXPROCS). Workers(1) runs the nodes one by one in TapeMachine's
//     order on the calling goroutine, deterministically.
//   - Hooks: OnReady, OnNodeReady and OnGradReady register functions called
//     on the worker that produced a value, right after it is ready and before
//     anything consuming it is scheduled. They must be fast or hand off.
//   - Buffer reuse: ops that can (gorgonia.UsePreallocDoer, ContextDoer)
//     write into the buffer they produced in the previous run, when the
//     program owns that memory (not a view of an input, a bound input or a
//     constant). Values read after a run are valid until the next Run.
//   - Outputs: SetOutput gives a node memory of the caller's to write its
//     value into, run after run (DDP computes gradients straight into the
//     buckets it reduces this way); ops write where the executor tells
//     them, and never guess whose memory a buffer is.
//   - Errors: the first op error, op panic (a *PanicError), hook error or
//     cancellation of ctx stops the run; it is returned wrapped as
//     `graph: node "name" (op): ...`. Run waits for the ops already started
//     before returning, so no goroutine outlives it and the program can run
//     again. Ops that may block (collectives) implement ContextDoer to see
//     the cancellation.
//   - Gradients: WithGrads maps each differentiated node to its gradient
//     node; BindDualValues stores gradients in dual values, accumulating as
//     TapeMachine's option of the same name does, so gorgonia's solvers work.
//
// Every node's value is kept after a run. TapeMachine, by contrast, lets an
// element-wise op overwrite a dead intermediate value in place, so on
// intermediate nodes the two can differ; outputs and gradients agree.
package graph
