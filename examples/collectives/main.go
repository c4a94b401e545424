// Command collectives is Tandem's first tutorial: every process of a job joins
// one process group and runs the basic collectives, printing what each rank
// holds before and after. Run it under Tandem's launcher:
//
//	go run ./cmd/tandem run -nproc 3 -- go run ./examples/collectives
//
// or, built once (go build -o bin/collectives ./examples/collectives), under
// the launcher you already use, with no variable set by hand:
//
//	mpirun -np 3 bin/collectives
//	srun -n3 bin/collectives
//	torchrun --standalone --nproc_per_node 2 --no_python bin/collectives
//
// (torch 1.13's torchrun on Python 3.11 also needs -r 1 -t 1), or on
// Kubernetes with the manifests in examples/kubernetes. Each launcher says
// in its own variables which rank this process is, how many there are and,
// directly or not, where rank 0 is; comm.InitFromEnv reads them (package
// launch has the rules), rank 0 hosts the rendezvous store and the others
// connect to it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

func main() {
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "collectives:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	// One line joins the job, whoever launched it.
	pg, err := comm.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	return demo(ctx, pg, w)
}

// demo runs each collective once on pg and prints this rank's view.
func demo(ctx context.Context, pg *comm.ProcessGroup, w io.Writer) error {
	rank, n := pg.Rank(), pg.Size()
	fmt.Fprintf(w, "rank %d of %d joined\n", rank, n)

	// All-reduce: every rank contributes [rank+1, 10*(rank+1)]; everyone
	// ends with the elementwise sum.
	x := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{float64(rank + 1), float64(10 * (rank + 1))}))
	if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
		return fmt.Errorf("all_reduce: %w", err)
	}
	fmt.Fprintf(w, "all_reduce(sum)  -> %v\n", x.Data())

	// Broadcast: rank 0's tensor overwrites everyone's.
	b := tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{float32(rank), float32(rank), float32(rank)}))
	if rank == 0 {
		copy(b.Data().([]float32), []float32{3, 1, 4})
	}
	if err := pg.Broadcast(ctx, b, 0).Wait(ctx); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	fmt.Fprintf(w, "broadcast(0)     -> %v\n", b.Data())

	// All-gather: each rank learns every rank's value.
	in := tensor.New(tensor.WithShape(1), tensor.WithBacking([]int64{int64(rank * rank)}))
	outs := make([]*tensor.Dense, n)
	for i := range outs {
		outs[i] = tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(1))
	}
	if err := pg.AllGather(ctx, outs, in).Wait(ctx); err != nil {
		return fmt.Errorf("all_gather: %w", err)
	}
	gathered := make([]int64, n)
	for i, o := range outs {
		gathered[i] = o.Data().([]int64)[0]
	}
	fmt.Fprintf(w, "all_gather       -> %v\n", gathered)

	// Max with ties: the largest value wins everywhere.
	m := tensor.New(tensor.WithShape(1), tensor.WithBacking([]int32{int32(rank % 2)}))
	if err := pg.AllReduce(ctx, m, comm.Max).Wait(ctx); err != nil {
		return fmt.Errorf("all_reduce(max): %w", err)
	}
	fmt.Fprintf(w, "all_reduce(max)  -> %v\n", m.Data())

	// A collective that ranks disagree on fails on every rank with a clear
	// error instead of hanging: here rank 0 sends a longer tensor.
	if n > 1 {
		size := 4
		if rank == 0 {
			size = 5
		}
		bad := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(size))
		err := pg.AllReduce(ctx, bad, comm.Sum).Wait(ctx)
		switch {
		case errors.Is(err, comm.ErrMismatch):
			fmt.Fprintf(w, "mismatch caught  -> %v\n", err)
		case err == nil:
			return errors.New("a mismatched all_reduce succeeded; it must fail on every rank")
		default:
			return fmt.Errorf("mismatched all_reduce: unexpected error: %w", err)
		}
	}
	return nil
}
