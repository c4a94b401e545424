package main

// `tandem store`: a standalone TCP store server, for jobs whose rendezvous
// should not live inside rank 0 (every rank then dials it as a client).

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

func init() {
	commands["store"] = command{
		summary: "run a standalone TCP store server until interrupted: tandem store -addr HOST:PORT [-token T]",
		run:     runStoreServer,
	}
}

func runStoreServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tandem store", flag.ContinueOnError)
	addr := fs.String("addr", ":29500", "`host:port` to listen on (port 0 picks a free one)")
	token := fs.String("token", "", "shared `secret` clients must present (default: $"+store.TokenEnv+"; empty accepts everyone)")
	timeout := fs.Duration("timeout", store.DefaultTimeout, "default bound of blocking requests that name none")
	maxValue := fs.Int("max-value", store.DefaultMaxValue, "largest value in `bytes` a client may store")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: tandem store -addr HOST:PORT [-token T] [flags]\n\n"+
			"Serves a TCP key-value store for rendezvous until interrupted (Ctrl-C or SIGTERM).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := []store.Option{
		store.WithLogger(logger),
		store.WithTimeout(*timeout),
		store.WithMaxValue(*maxValue),
		store.WithMaxFrame(*maxValue + 1<<20),
	}
	tokenSet := false
	fs.Visit(func(f *flag.Flag) { tokenSet = tokenSet || f.Name == "token" })
	if tokenSet {
		opts = append(opts, store.WithToken(*token))
	}
	srv, err := store.NewServer(*addr, opts...)
	if err != nil {
		return err
	}
	auth := "no token required"
	if tokenSet && *token != "" || !tokenSet && os.Getenv(store.TokenEnv) != "" {
		auth = "token required"
	}
	// The address line goes to stdout so that scripts can read the port.
	fmt.Printf("tandem store: listening on %s (%s)\n", srv.Addr(), auth)
	start := time.Now()
	err = srv.Serve(ctx)
	logger.Info("tandem store: stopped", "after", time.Since(start).Round(time.Second))
	return err
}
