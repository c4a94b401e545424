// Command plain_gorgonia is a plain gorgonia program (G.NewGraph, G.Mul,
// G.Grad, a gorgonia Solver) made data-parallel with Tandem's ddp package
// in a few lines. It fits a small two-layer network to a known function on
// every rank's share of the data. Run it under the launcher:
//
//	go run ./cmd/tandem run -nproc 2 -- go run ./examples/plain_gorgonia
//
// See README.md for the tutorial.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
)

// config is what the flags set.
type config struct {
	steps   int     // training steps
	batch   int     // examples per rank and step
	lr      float64 // the solver's learning rate
	tape    bool    // run under gorgonia's TapeMachine instead of Tandem's executor
	bucket  float64 // bucket cap in MiB
	every   int     // print the loss every this many steps
	seed    uint64  // each rank draws its initial weights from seed+rank
	timeout time.Duration
}

func main() {
	var c config
	flag.IntVar(&c.steps, "steps", 300, "training steps")
	flag.IntVar(&c.batch, "batch", 32, "examples per rank and step")
	flag.Float64Var(&c.lr, "lr", 0.05, "learning rate of gorgonia's Adam solver")
	flag.BoolVar(&c.tape, "tape", false, "run the graph under gorgonia's TapeMachine (no overlap of communication with backward)")
	flag.Float64Var(&c.bucket, "bucket-cap-mb", ddp.DefaultBucketCapMB, "bucket cap in MiB (try 0.0001: a bucket per node, reduced while backward goes on)")
	flag.IntVar(&c.every, "every", 50, "print the loss every this many steps")
	flag.Uint64Var(&c.seed, "seed", 1, "each rank draws its initial weights from its own random source, seeded with this plus its rank")
	flag.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "plain_gorgonia:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, w io.Writer) error {
	// Join the job, whoever launched it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
	pg, err := comm.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	_, err = train(ctx, pg, c, w)
	return err
}

// target is the function the network learns.
// buildMu serializes the building of graphs in this process. gorgonia
// keeps package-level constant nodes (the 1 that seeds every gradient)
// whose hash it computes lazily, so goroutine ranks of one process (the
// tests) differentiating graphs at the same moment race on them. One rank
// per process, as tandem run starts them, never contends.
var buildMu sync.Mutex

// glorotU is gorgonia's G.GlorotU(1) for float64 matrices, drawn from rng
// instead of gorgonia's global random source, so that a run can be
// repeated: uniform in ±sqrt(6/(fan-in+fan-out)).
func glorotU(rng *rand.Rand) G.InitWFn {
	return func(_ tensor.Dtype, s ...int) interface{} {
		limit := math.Sqrt(6 / float64(s[0]+s[1]))
		v := make([]float64, s[0]*s[1])
		for i := range v {
			v[i] = (2*rng.Float64() - 1) * limit
		}
		return v
	}
}

func target(x0, x1 float64) float64 { return math.Sin(2*x0) + 0.5*x1*x1 }

// result is what train returns, for the test.
type result struct {
	firstLoss, lastLoss float64 // averaged over the ranks
	weights             []float64
	stats               ddp.Stats
}

// train builds the model, wraps it in DDP and trains it on this rank's
// share of the data; rank 0 reports.
func train(ctx context.Context, pg *comm.ProcessGroup, c config, w io.Writer) (*result, error) {
	rank, world := pg.Rank(), pg.Size()
	if rank != 0 {
		w = io.Discard
	}

	// 1. A plain gorgonia model: pred = tanh(x·W1 + b1)·W2, loss = mean((pred-y)²).
	//    The initial weights come from each process's own random source;
	//    DDP replaces them by rank 0's.
	init := rand.New(rand.NewPCG(c.seed+uint64(rank), 0))
	buildMu.Lock() // see buildMu
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(c.batch, 2), G.WithName("x"))
	y := G.NewMatrix(g, G.Float64, G.WithShape(c.batch, 1), G.WithName("y"))
	w1 := G.NewMatrix(g, G.Float64, G.WithShape(2, 16), G.WithName("w1"), G.WithInit(glorotU(init)))
	b1 := G.NewMatrix(g, G.Float64, G.WithShape(1, 16), G.WithName("b1"), G.WithInit(G.Zeroes()))
	w2 := G.NewMatrix(g, G.Float64, G.WithShape(16, 1), G.WithName("w2"), G.WithInit(glorotU(init)))
	h := G.Must(G.Tanh(G.Must(G.BroadcastAdd(G.Must(G.Mul(x, w1)), b1, nil, []byte{0}))))
	pred := G.Must(G.Mul(h, w2))
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(pred, y))))))
	params := G.Nodes{w1, b1, w2}
	grads, err := G.Grad(loss, params...)
	buildMu.Unlock()
	if err != nil {
		return nil, err
	}
	solver := G.NewAdamSolver(G.WithLearnRate(c.lr))

	// 2. Data parallelism: DDP checks every rank built the same graph,
	//    broadcasts rank 0's weights, and averages the gradients in buckets.
	opts := []ddp.Option{ddp.BucketCapMB(c.bucket)}
	if c.tape {
		opts = append(opts, ddp.WithTapeMachine())
	}
	net, err := ddp.NewGraph(ctx, pg, ddp.GraphSpec{Graph: g, Loss: loss, Params: params, Grads: grads}, opts...)
	if err != nil {
		return nil, err
	}
	executor := "Tandem's graph executor"
	if c.tape {
		executor = "gorgonia's TapeMachine"
	}
	fmt.Fprintf(w, "rank 0 of %d: %d learnable nodes in %d bucket(s), %s\n", world, len(params), len(net.Buckets()), executor)

	// 3. Each rank trains on its own share of the data: the same stream of
	//    examples on every rank, rank r taking rows r, r+world, r+2·world, ...
	rng := rand.New(rand.NewPCG(2024, 1))
	xb := tensor.New(tensor.WithShape(c.batch, 2), tensor.Of(tensor.Float64))
	yb := tensor.New(tensor.WithShape(c.batch, 1), tensor.Of(tensor.Float64))
	res := &result{}
	for step := 1; step <= c.steps; step++ {
		xs, ys := xb.Float64s(), yb.Float64s()
		for i := 0; i < c.batch*world; i++ {
			x0, x1 := 2*rng.Float64()-1, 2*rng.Float64()-1
			if i%world == rank {
				k := i / world
				xs[2*k], xs[2*k+1], ys[k] = x0, x1, target(x0, x1)
			}
		}
		// forward, backward, and the averaged gradient in every node's Grad()
		l, err := net.Step(ctx, ddp.ByName{"x": xb, "y": yb})
		if err != nil {
			return nil, err
		}
		// the update: gorgonia's own solver, the same step on every rank
		if err := net.Apply(solver); err != nil {
			return nil, err
		}
		if step == 1 || step == c.steps || step%c.every == 0 {
			mean, err := meanOverRanks(ctx, pg, l)
			if err != nil {
				return nil, err
			}
			if step == 1 {
				res.firstLoss = mean
			}
			res.lastLoss = mean
			fmt.Fprintf(w, "step %4d  loss %.5f\n", step, mean)
		}
	}

	// 4. The replicas are identical: compare every rank's weights with rank 0's.
	for _, p := range net.Params() {
		res.weights = append(res.weights, p.Value.Float64s()...)
	}
	diff, err := maxDiffFromRank0(ctx, pg, res.weights)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "replicas agree: largest difference from rank 0's weights %g\n", diff)
	if diff != 0 {
		return nil, errors.New("the replicas differ")
	}
	res.stats = net.Stats()
	st := res.stats
	fmt.Fprintf(w, "%d steps, %d bucket reductions, %d started before the backward pass ended\n", st.Steps, st.BucketsReduced, st.BucketsOverlapped)
	return res, nil
}

// meanOverRanks averages v over the ranks.
func meanOverRanks(ctx context.Context, pg *comm.ProcessGroup, v float64) (float64, error) {
	t := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{v}))
	if err := pg.AllReduce(ctx, t, comm.Sum).Wait(ctx); err != nil {
		return 0, err
	}
	return t.Float64s()[0] / float64(pg.Size()), nil
}

// maxDiffFromRank0 returns the largest difference between any rank's
// values and rank 0's.
func maxDiffFromRank0(ctx context.Context, pg *comm.ProcessGroup, v []float64) (float64, error) {
	ref := tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(append([]float64(nil), v...)))
	if err := pg.Broadcast(ctx, ref, 0).Wait(ctx); err != nil {
		return 0, err
	}
	d := 0.0
	for i, x := range ref.Float64s() {
		d = math.Max(d, math.Abs(x-v[i]))
	}
	t := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{d}))
	if err := pg.AllReduce(ctx, t, comm.Max).Wait(ctx); err != nil {
		return 0, err
	}
	return t.Float64s()[0], nil
}
