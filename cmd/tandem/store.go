package main

// `tandem store`: a standalone TCP store server, for jobs whose rendezvous
// should not live inside rank 0 (every rank then dials it as a client).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// defaultStoreAddr is where `tandem store` listens without -addr: loopback
// only, so that a store started for a quick try is not open to the network.
const defaultStoreAddr = "127.0.0.1:29500"

func init() {
	commands["store"] = command{
		summary: "run a standalone TCP store server until interrupted: tandem store [-addr HOST:PORT] -token T | -insecure",
		run:     runStoreServer,
	}
}

// errNoToken is why `tandem store` will not start without a token.
var errNoToken = errors.New("no token: without one any process that reaches the store could read and change it. " +
	"Give a shared secret with -token T or $" + store.TokenEnv + " (every client needs the same one), " +
	"or pass -insecure to serve without a token")

// storeFlags is what `tandem store` was asked for.
type storeFlags struct {
	addr     string
	token    string // the token in force: -token, else $TANDEM_TOKEN
	insecure bool
	timeout  time.Duration
	maxValue int
}

// parseStoreFlags reads `tandem store`'s flags and checks them: a token is
// required unless -insecure.
func parseStoreFlags(args []string) (storeFlags, error) {
	var f storeFlags
	fs := flag.NewFlagSet("tandem store", flag.ContinueOnError)
	fs.StringVar(&f.addr, "addr", defaultStoreAddr, "`host:port` to listen on (port 0 picks a free one); "+
		"the default listens on loopback only: name this machine's address, or :PORT for every interface, to serve other machines")
	token := fs.String("token", "", "shared `secret` clients must present (default: $"+store.TokenEnv+"; "+
		"prefer the variable, which other users cannot read in the process list)")
	fs.BoolVar(&f.insecure, "insecure", false, "serve without a token: any process that reaches the address may read and change the store")
	fs.DurationVar(&f.timeout, "timeout", store.DefaultTimeout, "default bound of blocking requests that name none")
	fs.IntVar(&f.maxValue, "max-value", store.DefaultMaxValue, "largest value in `bytes` a client may store")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: tandem store [-addr HOST:PORT] -token T | -insecure [flags]\n\n"+
			"Serves a TCP key-value store for rendezvous until interrupted (Ctrl-C or SIGTERM).\n"+
			"It listens on "+defaultStoreAddr+" unless -addr names another address, and requires\n"+
			"clients to present a token (-token or $"+store.TokenEnv+") unless -insecure.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	f.token = os.Getenv(store.TokenEnv)
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "token" {
			f.token = *token
		}
	})
	if f.token == "" && !f.insecure {
		return f, errNoToken
	}
	return f, nil
}

func runStoreServer(ctx context.Context, args []string) error {
	f, err := parseStoreFlags(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := store.NewServer(f.addr,
		store.WithLogger(logger),
		store.WithToken(f.token),
		store.WithTimeout(f.timeout),
		store.WithMaxValue(f.maxValue),
		store.WithMaxFrame(f.maxValue+1<<20),
	)
	if err != nil {
		return err
	}
	auth := "token required"
	if f.token == "" {
		auth = "no token required: -insecure"
	}
	// The address line goes to stdout so that scripts can read the port.
	fmt.Printf("tandem store: listening on %s (%s)\n", srv.Addr(), auth)
	start := time.Now()
	err = srv.Serve(ctx)
	logger.Info("tandem store: stopped", "after", time.Since(start).Round(time.Second))
	return err
}
