// Command tensor_parallel is Tandem's tensor-parallelism tutorial: a
// two-layer MLP whose hidden layer is split across the ranks, Megatron style,
// trained with SGD, and checked against the same MLP trained in one process.
//
// Run it with goroutine ranks in one process:
//
//	go run ./examples/tensor_parallel              # 2 ranks
//	go run ./examples/tensor_parallel -world 4     # 4 ranks
//
// or with one process per rank under the launcher:
//
//	go run ./cmd/tandem run -nproc 2 -- go run ./examples/tensor_parallel
//
// README.md explains where each collective sits and why its backward pass is
// what it is.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
)

// tolerance is how far the tensor-parallel weights may be from the
// single-process ones: the two sum the hidden units in different orders.
const tolerance = 1e-10

func main() {
	world := flag.Int("world", 2, "number of goroutine ranks (ignored when started by a launcher that sets WORLD_SIZE)")
	steps := flag.Int("steps", 40, "SGD steps")
	hidden := flag.Int("hidden", 16, "hidden units (a multiple of the number of ranks)")
	lr := flag.Float64("lr", 0.2, "learning rate")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	cfg := config{in: 4, hidden: *hidden, out: 2, batch: 32, steps: *steps, lr: *lr, seed: 42}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var err error
	if os.Getenv("WORLD_SIZE") != "" {
		err = launched(ctx, cfg, os.Stdout)
	} else {
		err = goroutines(ctx, cfg, *world, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tensor_parallel:", err)
		os.Exit(1)
	}
}

// launched runs this process as one rank of a job started by a launcher
// (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment).
func launched(ctx context.Context, cfg config, w io.Writer) error {
	pg, err := comm.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	k, err := newRank(pg, cfg)
	if err != nil {
		return err
	}
	losses, err := train(ctx, k)
	if err != nil {
		return err
	}
	ref, refLosses, err := trainSingle(ctx, cfg)
	if err != nil {
		return err
	}
	if pg.Rank() == 0 {
		printLosses(w, losses, refLosses)
	}
	err = compare(w, pg.Rank(), k, ref)
	// Leave together: closing while a peer still talks to this rank would
	// fail the peer.
	if berr := pg.Barrier(ctx).Wait(ctx); err == nil {
		err = berr
	}
	return err
}

// goroutines runs world ranks as goroutines of this process over the local
// backend.
func goroutines(ctx context.Context, cfg config, world int, w io.Writer) error {
	pgs, err := local.NewGroups(ctx, world)
	if err != nil {
		return err
	}
	defer func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			wg.Add(1)
			go func() { defer wg.Done(); pg.Close() }()
		}
		wg.Wait()
	}()
	// Build the ranks' graphs one after the other (gorgonia shares a few
	// constant nodes between graphs while it builds them), then train them
	// together.
	ranks := make([]*tpRank, world)
	for r, pg := range pgs {
		if ranks[r], err = newRank(pg, cfg); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	losses := make([][]float64, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, k := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if losses[r], errs[r] = train(ctx, k); errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				k.pg.Abort(errs[r]) // the other ranks stop at once
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ref, refLosses, err := trainSingle(ctx, cfg)
	if err != nil {
		return err
	}
	printLosses(w, losses[0], refLosses)
	for r, k := range ranks {
		errs[r] = compare(w, r, k, ref)
	}
	return errors.Join(errs...)
}

// newRank builds rank pg.Rank()'s shard of the model.
func newRank(pg *comm.ProcessGroup, cfg config) (*tpRank, error) {
	sh, err := initWeights(cfg).shard(pg.Rank(), pg.Size())
	if err != nil {
		return nil, err
	}
	return newTPRank(pg, cfg, sh)
}

// train runs every step and returns the losses.
func train(ctx context.Context, k *tpRank) ([]float64, error) {
	losses := make([]float64, k.cfg.steps)
	for s := range losses {
		x, y := batchAt(k.cfg, s)
		var err error
		if losses[s], err = k.step(ctx, x, y); err != nil {
			return nil, fmt.Errorf("step %d: %w", s, err)
		}
	}
	return losses, nil
}

func printLosses(w io.Writer, tp, single []float64) {
	every := max(1, len(tp)/8)
	for s := range tp {
		if s%every == 0 || s == len(tp)-1 {
			fmt.Fprintf(w, "step %3d  loss %.6f  (single process %.6f)\n", s, tp[s], single[s])
		}
	}
}

// compare checks rank r's trained shard against the same shard of the
// single-process model.
func compare(w io.Writer, r int, k *tpRank, ref weights) error {
	want, err := ref.shard(r, k.pg.Size())
	if err != nil {
		return err
	}
	d := maxDiff(k.w, want)
	if !(d <= tolerance) {
		return fmt.Errorf("rank %d: shard differs from single-process training by %g (tolerance %g)", r, d, tolerance)
	}
	fmt.Fprintf(w, "rank %d: shard matches single-process training (max |difference| %.1e)\n", r, d)
	return nil
}
