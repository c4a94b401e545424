package main

// `tandem store`: a standalone TCP store server, for jobs whose rendezvous
// should not live inside rank 0 (every rank then dials it as a client).
// With -torch-protocol it serves PyTorch's TCPStore protocol instead
// (torchstore.Server), for torch.distributed.TCPStore clients: that protocol
// carries no token, so it is opt-in and needs -insecure as well.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
)

// defaultStoreAddr is where `tandem store` listens without -addr: loopback
// only, so that a store started for a quick try is not open to the network.
const defaultStoreAddr = "127.0.0.1:29500"

func init() {
	commands["store"] = command{
		summary: "run a standalone TCP store server until interrupted: tandem store [-addr HOST:PORT] -token T | -insecure [-torch-protocol]",
		run:     runStoreServer,
	}
}

// errNoToken is why `tandem store` will not start without a token.
var errNoToken = errors.New("no token: without one any process that reaches the store could read and change it. " +
	"Give a shared secret with -token T or $" + store.TokenEnv + " (every client needs the same one), " +
	"or pass -insecure to serve without a token")

// errTorchNeedsInsecure is why `tandem store -torch-protocol` will not start
// without -insecure.
var errTorchNeedsInsecure = errors.New("-torch-protocol serves PyTorch's TCPStore protocol, which cannot authenticate: " +
	"any process that reaches the address can read, change and delete every key, whatever the token. " +
	"Pass -insecure as well to serve it anyway (on a trusted network or loopback only), " +
	"or drop -torch-protocol for Tandem's own store, which checks a token")

// storeFlags is what `tandem store` was asked for.
type storeFlags struct {
	addr     string
	token    string // the token in force: -token, else $TANDEM_TOKEN
	insecure bool
	torch    bool // serve PyTorch's TCPStore protocol (unauthenticated)
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
	fs.BoolVar(&f.torch, "torch-protocol", false, "serve PyTorch's TCPStore protocol (as torch 1.13 speaks it) for torch.distributed.TCPStore "+
		"clients instead of Tandem's; it cannot check a token, so it needs -insecure too and refuses -token")
	fs.DurationVar(&f.timeout, "timeout", store.DefaultTimeout, "default bound of blocking requests that name none")
	fs.IntVar(&f.maxValue, "max-value", store.DefaultMaxValue, "largest value in `bytes` a client may store")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: tandem store [-addr HOST:PORT] -token T | -insecure [flags]\n\n"+
			"Serves a TCP key-value store for rendezvous until interrupted (Ctrl-C or SIGTERM).\n"+
			"It listens on "+defaultStoreAddr+" unless -addr names another address, and requires\n"+
			"clients to present a token (-token or $"+store.TokenEnv+") unless -insecure.\n"+
			"With -torch-protocol -insecure it speaks PyTorch's TCPStore protocol, which has no\n"+
			"authentication at all: serve it on loopback or a trusted network only.")
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
	tokenFlag := false
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "token" {
			f.token, tokenFlag = *token, true
		}
	})
	if f.torch {
		switch {
		case tokenFlag:
			return f, fmt.Errorf("-token with -torch-protocol: %w", errTorchNeedsInsecure)
		case !f.insecure:
			return f, errTorchNeedsInsecure
		}
		return f, nil
	}
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
	if f.torch {
		return serveTorchProtocol(ctx, f, logger)
	}
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

// serveTorchProtocol runs `tandem store -torch-protocol -insecure`: PyTorch's
// TCPStore protocol, without any authentication, saying so on stdout and in
// the log.
func serveTorchProtocol(ctx context.Context, f storeFlags, logger *slog.Logger) error {
	addr := f.addr
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		// ":PORT" means every interface, as for Tandem's store (the
		// torchstore server would take it for loopback).
		addr = net.JoinHostPort("0.0.0.0", port)
	}
	srv, err := torchstore.NewServer(addr, torchstore.Unauthenticated(),
		torchstore.WithLogger(logger), torchstore.WithMaxValue(f.maxValue))
	if err != nil {
		return err
	}
	if f.token != "" {
		logger.Warn("tandem store: $" + store.TokenEnv + " is set but ignored: PyTorch's TCPStore protocol cannot check a token")
	}
	logger.Warn("tandem store: serving PyTorch's TCPStore protocol WITHOUT AUTHENTICATION: any process that reaches this address can read, change and delete every key",
		"addr", srv.Addr())
	fmt.Printf("tandem store: listening on %s (PyTorch TCPStore protocol; UNAUTHENTICATED: anyone who reaches it can read and change every key)\n", srv.Addr())
	start := time.Now()
	err = srv.Serve(ctx)
	logger.Info("tandem store: stopped", "after", time.Since(start).Round(time.Second))
	return err
}
