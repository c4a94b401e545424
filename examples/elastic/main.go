// Command elastic trains the Fashion-MNIST CNN of `make demo` data-parallel
// over members that come and go: each process is one member (one "host"),
// they meet in a standalone store, and when one dies the others go on
// without it; when one arrives it is healed from a live member and joins.
// See README.md for a walk through.
//
// One member:
//
//	elastic -store HOST:PORT -id NAME [-min 2 -max 3 -epochs 5 ...]
//
// The scripted demonstration (a store, three members, one killed at 30% of
// the training and a new one started at 60%):
//
//	elastic -demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// config is a member's command line.
type config struct {
	Store     string        // the job's store, HOST:PORT
	ID        string        // this member's name
	Min, Max  int           // round sizes
	Epochs    int           // passes over the training set
	Batch     int           // examples per member and step
	Base      int           // the world size -lr is tuned for
	LR        float64       // learning rate at -base members
	Limit     int           // training examples used (0: all)
	Seed      uint64        // initial weights and shuffling
	Data      string        // Fashion-MNIST folder
	Report    string        // where to write this member's report (JSON)
	Every     float64       // fraction of the training between progress lines
	StepDelay time.Duration // sleep after each step (tests: a job long enough to hurt)
	Eval      bool          // evaluate on the test set at the end
	Token     string        // the store's token
	Verbose   bool          // the library's warnings on stderr
	C1, C2, H int           // the CNN's channels and hidden width
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "elastic:", err)
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("elastic", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var cfg config
	fl.StringVar(&cfg.Store, "store", "", "the job's store, HOST:PORT (a standalone `tandem store`)")
	fl.StringVar(&cfg.ID, "id", "", "this member's name (default host-pid-random)")
	fl.IntVar(&cfg.Min, "min", 2, "fewest members a round may have")
	fl.IntVar(&cfg.Max, "max", 3, "most members a round may have")
	fl.IntVar(&cfg.Epochs, "epochs", 5, "passes over the training set")
	fl.IntVar(&cfg.Batch, "batch", 64, "examples per member and step")
	fl.IntVar(&cfg.Base, "base", 2, "the number of members -lr is tuned for; the learning rate follows the world's size linearly from there")
	fl.Float64Var(&cfg.LR, "lr", 0.05, "learning rate at -base members (SGD, momentum 0.9, cosine over -epochs)")
	fl.IntVar(&cfg.Limit, "limit", 0, "train on the first N training examples only (0: all 60000)")
	fl.Uint64Var(&cfg.Seed, "seed", 1, "seed of the initial weights and of the shuffling")
	fl.StringVar(&cfg.Data, "data", "", "folder holding the Fashion-MNIST files (default: $TANDEM_DATA, then the Debian package's)")
	fl.StringVar(&cfg.Report, "report", "", "write this member's report here when training ends (JSON)")
	fl.Float64Var(&cfg.Every, "every", 0.05, "fraction of the training between progress lines")
	fl.DurationVar(&cfg.StepDelay, "step-delay", 0, "sleep after every step (to slow a small run down)")
	fl.BoolVar(&cfg.Eval, "eval", true, "evaluate on the test set at the end (rank 0)")
	fl.IntVar(&cfg.C1, "channels1", 16, "channels of the CNN's first convolution")
	fl.IntVar(&cfg.C2, "channels2", 32, "channels of the CNN's second convolution")
	fl.IntVar(&cfg.H, "hidden", 128, "width of the CNN's hidden layer")
	fl.BoolVar(&cfg.Verbose, "v", false, "log the library's warnings about faults on stderr")
	demo := fl.Bool("demo", false, "run the scripted demonstration: a store, three members, one killed and another started while they train")
	kill := fl.Float64("kill-at", 0.3, "with -demo: kill a member when training is this far")
	add := fl.Float64("add-at", 0.6, "with -demo: start a new member when training is this far")
	if err := fl.Parse(args); err != nil {
		return err
	}
	cfg.Token = os.Getenv("TANDEM_TOKEN")
	if cfg.C1 < 1 || cfg.C2 < 1 || cfg.H < 1 || cfg.Epochs < 1 || cfg.Batch < 1 || cfg.Base < 1 || !(cfg.LR > 0) || cfg.Limit < 0 || cfg.Min < 1 || cfg.Max < cfg.Min {
		return fmt.Errorf("need -epochs, -batch, -base >= 1, -lr > 0, -limit >= 0 and 1 <= -min <= -max (got %d, %d, %d, %v, %d, %d, %d)",
			cfg.Epochs, cfg.Batch, cfg.Base, cfg.LR, cfg.Limit, cfg.Min, cfg.Max)
	}
	if *demo {
		return runDemo(ctx, cfg, fl.Args(), *kill, *add, stdout)
	}
	if cfg.Store == "" {
		return fmt.Errorf("-store HOST:PORT is required (start one with `tandem store -addr HOST:PORT`), or run -demo")
	}
	return runMember(ctx, cfg, stdout)
}
