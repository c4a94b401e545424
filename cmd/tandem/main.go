// Command tandem is Tandem's command-line tool: the launcher (`tandem run`), a
// standalone store server (`tandem store`), the benchmarks (`tandem bench`),
// the reader of the ranks' flight records after a hang (`tandem debug`) and
// the merger of the ranks' DDP timelines (`tandem timeline`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one `tandem` subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands lists the subcommands; each file of this package adds its own in init.
var commands = map[string]command{}

// benches lists the benchmarks under `tandem bench`; each bench_*.go adds its own.
var benches = map[string]command{}

// exitCoder lets a subcommand choose the process exit code (tandem run exits
// with the code of the worker that failed).
type exitCoder interface{ ExitCode() int }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:]))
}

func runMain(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "help" {
		usage()
		return 2
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "tandem: unknown command %q\n\n", args[0])
		usage()
		return 2
	}
	if err := cmd.run(ctx, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(os.Stderr, "tandem %s: %v\n", args[0], err)
		var ec exitCoder
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tandem COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, commands[n].summary)
	}
}

func init() {
	commands["bench"] = command{summary: "run a benchmark: tandem bench NAME [flags]", run: runBench}
}

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 || benches[args[0]].run == nil {
		names := make([]string, 0, len(benches))
		for n := range benches {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(args) == 0 {
			return fmt.Errorf("name a benchmark: one of %v", names)
		}
		return fmt.Errorf("unknown benchmark %q: one of %v", args[0], names)
	}
	return benches[args[0]].run(ctx, args[1:])
}

// commandFlags returns the flag set of `tandem name`, whose usage message
// is usage (a synopsis, a blank line, a paragraph) followed by the flags.
func commandFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("tandem "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFileArgs parses args with fs and returns the files they name after
// the flags; without any it prints the usage and says that the files,
// described by what, are missing.
func parseFileArgs(fs *flag.FlagSet, args []string, what string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, fmt.Errorf("name %s: %w", what, flag.ErrHelp)
	}
	return fs.Args(), nil
}
