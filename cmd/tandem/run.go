package main

// `tandem run`: start one node's share of a distributed job. The flags and
// the environment each worker sees are set up here; starting, watching and
// stopping the workers lives in run_launch.go, the rank prefixes on their
// output in run_prefix.go.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/launch"
)

func init() {
	commands["run"] = command{
		summary: "start N workers with RANK, WORLD_SIZE, MASTER_ADDR... set: tandem run -nproc N -- CMD ARGS",
		run:     runRun,
	}
}

// Defaults of `tandem run`.
const (
	defaultGrace = 5 * time.Second
	tokenEnv     = launch.TokenEnv
)

// runConfig is a parsed and checked `tandem run` command line.
type runConfig struct {
	nproc      int           // workers on this node
	nnodes     int           // nodes in the job
	nodeRank   int           // this node's index, 0 <= nodeRank < nnodes
	masterAddr string        // host of rank 0's store
	masterPort int           // its port
	token      string        // shared secret every worker gets as TANDEM_TOKEN
	prefix     bool          // prefix every output line with the worker's rank
	grace      time.Duration // SIGTERM to SIGKILL delay when stopping workers
	argv       []string      // the worker command and its arguments
	metrics    string        // -metrics-addr: worker local serves at its port+local (launch.MetricsAddrEnv)

	maxRestarts int  // restarts of all workers after a failure (single node, or rounds of an elastic job)
	restart     int  // this start's number: 0, then 1.. for restarts
	autoMaster  bool // the master was picked here (a free port), not given

	elastic     *elasticConfig // -rdzv-endpoint: nodes meet in rendezvous rounds (run_elastic.go); nil for a fixed job
	runID       string         // TANDEM_RUN_ID for the workers ("" for a fixed job)
	storePrefix string         // TANDEM_STORE_PREFIX: the round's keys in the rendezvous store
}

// worldSize is the number of workers on all nodes together.
func (c runConfig) worldSize() int { return c.nproc * c.nnodes }

// rank is the global rank of this node's worker number local.
func (c runConfig) rank(local int) int { return c.nodeRank*c.nproc + local }

// workerEnv is the environment of this node's worker number local: the
// launcher's own environment with the job's variables (launch.Job.Environ)
// set over it.
func (c runConfig) workerEnv(base []string, local int) []string {
	env := c.job(local).Environ()
	if c.metrics != "" {
		addr, _ := launch.WorkerMetricsAddr(c.metrics, local) // checked in parseRunFlags
		env = append(env, launch.MetricsAddrEnv+"="+addr)
	}
	return launch.Overlay(base, env)
}

// job is this node's worker number local as package launch describes it.
func (c runConfig) job(local int) launch.Job {
	return launch.Job{
		Launcher: launch.TandemRun,
		Rank:     c.rank(local), WorldSize: c.worldSize(),
		LocalRank: local, LocalWorldSize: c.nproc,
		NodeRank: c.nodeRank, NumNodes: c.nnodes,
		MasterAddr: c.masterAddr, MasterPort: c.masterPort,
		RestartCount: c.restart, MaxRestarts: c.maxRestarts,
		Token: c.token, RunID: c.runID, StorePrefix: c.storePrefix,
	}
}

// usageError is a mistake on the command line: it wraps errs.InvalidArgument
// and makes tandem exit with status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }
func (e *usageError) ExitCode() int { return 2 }

func badUsage(format string, a ...any) error {
	return &usageError{fmt.Errorf("%w: "+format, append([]any{errs.InvalidArgument}, a...)...)}
}

// exitError ends `tandem run` with a chosen exit status: the failed worker's
// code, 128+signal, 127 for a command that cannot be found.
type exitError struct {
	code int
	msg  string
	err  error // optional cause, reachable with errors.Is/As
	// workerFailed: a worker exited with a failure (not a signal to tandem
	// run, a cancelled context or a start that failed): what -max-restarts
	// restarts after.
	workerFailed bool
	// failedRank and failedHow name the failed worker and how it ended
	// ("exited with code 3"), for the reason of an elastic restart.
	failedRank int
	failedHow  string
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }
func (e *exitError) ExitCode() int { return e.code }

const runUsage = `usage: tandem run [flags] -- CMD [ARGS...]

Starts -nproc copies of CMD on this node, each in its own process group, with
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT, TANDEM_TOKEN, TANDEM_RESTART_COUNT and TANDEM_MAX_RESTARTS set.
Every line a worker prints is prefixed with its rank ("[3] "), stdout to
stdout and stderr to stderr.

If a worker fails, the others get SIGTERM, then SIGKILL after -grace, and
tandem run exits with the failed worker's code (128+N if signal N killed it).
With -max-restarts N (one node; for several, see elastic jobs below), it
starts all the workers again instead, up to N times, with
TANDEM_RESTART_COUNT counting the restarts: a job that saves checkpoints
resumes from its last one (ddp_fashion -resume, say).
SIGINT or SIGTERM to tandem run is passed on to every worker the same way, and
tandem run then exits with 128+N. A second signal kills the workers at once.

One node: the master is 127.0.0.1 on a free port and a random token is made
unless -master or -token (or $TANDEM_TOKEN) say otherwise.
Several nodes: run tandem run on each node with the same -nnodes, -master and
token and its own -node-rank, for example
  TANDEM_TOKEN=$(cat secret) tandem run -nproc 4 -nnodes 2 -node-rank 0 -master node0:29500 -- ./train
  TANDEM_TOKEN=$(cat secret) tandem run -nproc 4 -nnodes 2 -node-rank 1 -master node0:29500 -- ./train
Rank 0 (on node 0) serves the store on the master's port.

Elastic jobs: with -rdzv-endpoint, the nodes need no fixed ranks and may
come and go. Start a store that no training node hosts, then tandem run on
each node with the same -nnodes MIN:MAX, -rdzv-endpoint and -rdzv-id:
  TANDEM_TOKEN=$(cat secret) tandem store -addr :29400
  TANDEM_TOKEN=$(cat secret) tandem run -nproc 4 -nnodes 2:3 -rdzv-endpoint store0:29400 -rdzv-id job7 -max-restarts 10 -- ./train
The launchers meet at the store in numbered rounds: a round forms when MAX
nodes have joined; with MIN or more, the first round forms when
-rdzv-last-call has passed since MIN were there, and a round after a
restart when every node of the round before is back or lost; without MIN
nodes within -rdzv-join-timeout, tandem run fails. Each round assigns node ranks (the last round's nodes keep their
order, newcomers come after), so RANK and WORLD_SIZE change with the
round; TANDEM_RESTART_COUNT is the round's number. The workers meet in the
same store under a fresh prefix for each round (TANDEM_STORE_PREFIX, which
comm.InitFromEnv honours). Each launcher bumps a heartbeat counter in the
store every second; a node whose counter stands still for 3s is lost. A
failed worker on any node, a lost node, or a node that arrives while the job
runs (it waits, and asks for the next round) ends the round on every node:
the workers are stopped (SIGTERM, -grace, SIGKILL) and the launchers meet
again. Every such restart counts against -max-restarts and is logged on
stderr with its round, its reason and the new world size; when they run
out, every launcher exits non-zero. When every worker of a round exits 0,
the run is complete: every launcher exits 0, and one that comes later
finds the run complete and exits 0 too.

flags:
`

// parseRunFlags reads the command line of `tandem run`. getenv supplies
// TANDEM_TOKEN when -token is not given; out receives the usage text for -h
// and flag syntax errors.
func parseRunFlags(args []string, getenv func(string) string, out io.Writer) (runConfig, error) {
	fs := flag.NewFlagSet("tandem run", flag.ContinueOnError)
	fs.SetOutput(out)
	cfg := runConfig{}
	fs.IntVar(&cfg.nproc, "nproc", 1, "number of worker `processes` to start on this node")
	nodes := nodeRange{min: 1, max: 1}
	fs.Var(&nodes, "nnodes", "number of nodes in the job, `N|MIN:MAX`, each running its own tandem run; a range MIN:MAX needs -rdzv-endpoint (an elastic job)")
	fs.IntVar(&cfg.nodeRank, "node-rank", 0, "this node's `index`, from 0 to nnodes-1; its workers get ranks node-rank*nproc ...")
	master := fs.String("master", "", "where rank 0 serves the store, as `host:port` (required with -nnodes > 1; default 127.0.0.1 on a free port)")
	fs.StringVar(&cfg.token, "token", "", "shared `secret` for the job (default $TANDEM_TOKEN, or a random one on a single node); prefer the variable, flags show in ps")
	noPrefix := fs.Bool("no-prefix", false, "pass worker output through unchanged, without the \"[rank] \" prefix")
	fs.DurationVar(&cfg.grace, "grace", defaultGrace, "how long stopped workers get between SIGTERM and SIGKILL")
	fs.IntVar(&cfg.maxRestarts, "max-restarts", 0, "after a worker fails, stop the others and start all again, at most `N` times (one node, or rounds of an elastic job)")
	fs.StringVar(&cfg.metrics, "metrics-addr", "", "have worker `host:port` plus its local rank serve Prometheus metrics (TANDEM_METRICS_ADDR; see package metrics)")
	rdzv := addElasticFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{fmt.Errorf("%w: %w", errs.InvalidArgument, err)}
	}
	cfg.prefix = !*noPrefix
	cfg.argv = fs.Args()
	cfg.nnodes = nodes.max
	if rdzv.endpoint != "" {
		return cfg, cfg.setElastic(fs, nodes, rdzv, getenv)
	}
	if nodes.min != nodes.max {
		return cfg, badUsage("-nnodes %s: a range of nodes needs an elastic job: add -rdzv-endpoint HOST:PORT (a `tandem store` every node reaches) and -rdzv-id RUNID", nodes)
	}

	switch {
	case len(cfg.argv) == 0:
		return cfg, badUsage("no command to run: write it after the flags, as in tandem run -nproc 2 -- python train.py")
	case cfg.nproc < 1:
		return cfg, badUsage("-nproc %d: need at least 1 worker per node", cfg.nproc)
	case cfg.nnodes < 1:
		return cfg, badUsage("-nnodes %d: need at least 1 node", cfg.nnodes)
	case cfg.nodeRank < 0 || cfg.nodeRank >= cfg.nnodes:
		return cfg, badUsage("-node-rank %d is out of range for -nnodes %d: use 0 to %d", cfg.nodeRank, cfg.nnodes, cfg.nnodes-1)
	case cfg.grace < 0:
		return cfg, badUsage("-grace %v: must not be negative", cfg.grace)
	case cfg.maxRestarts < 0:
		return cfg, badUsage("-max-restarts %d: must not be negative", cfg.maxRestarts)
	case cfg.maxRestarts > 0 && cfg.nnodes > 1:
		return cfg, badUsage("-max-restarts with a fixed -nnodes works for single-node jobs only: restarting several nodes together needs a rendezvous of the launchers: give -rdzv-endpoint HOST:PORT (a `tandem store`) and -rdzv-id RUNID, and leave out -node-rank and -master")
	}

	if cfg.metrics != "" {
		if _, err := launch.WorkerMetricsAddr(cfg.metrics, cfg.nproc-1); err != nil {
			return cfg, &usageError{fmt.Errorf("-metrics-addr: %w", err)}
		}
	}

	if *master != "" {
		host, port, err := parseMaster(*master)
		if err != nil {
			return cfg, err
		}
		cfg.masterAddr, cfg.masterPort = host, port
	} else if cfg.nnodes > 1 {
		return cfg, badUsage("-nnodes %d needs -master HOST:PORT, the address of node 0 that every node can reach (rank 0 serves the store there), the same on every node", cfg.nnodes)
	}

	if cfg.token == "" {
		cfg.token = getenv(tokenEnv)
	}
	if cfg.token == "" {
		if cfg.nnodes > 1 {
			return cfg, badUsage("-nnodes %d needs a token shared by all nodes: set TANDEM_TOKEN (or -token) to the same secret on every node, e.g. TANDEM_TOKEN=$(openssl rand -hex 16)", cfg.nnodes)
		}
		tok, err := randomToken()
		if err != nil {
			return cfg, err
		}
		cfg.token = tok
	}
	return cfg, nil
}

// parseMaster checks a -master value and splits it into host and port.
func parseMaster(s string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, badUsage("-master %q: want HOST:PORT, as in node0:29500 or [fd00::1]:29500 (%v)", s, err)
	}
	if host == "" {
		return "", 0, badUsage("-master %q: the host is missing; want HOST:PORT, as in node0:29500", s)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, badUsage("-master %q: port %q is not a number from 1 to 65535", s, portStr)
	}
	return host, port, nil
}

// randomToken makes a fresh 128-bit secret for a single-node job.
func randomToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a random token: %w (pass -token or set TANDEM_TOKEN)", err)
	}
	return hex.EncodeToString(b), nil
}

// defaultMaster fills in the master of a single-node job that has no
// -master: 127.0.0.1 on a free port.
func (c *runConfig) defaultMaster() error {
	if c.masterAddr != "" {
		return nil
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	c.masterAddr, c.masterPort, c.autoMaster = "127.0.0.1", port, true
	return nil
}

// freeLoopbackPort asks the kernel for a TCP port on 127.0.0.1 that nobody
// uses right now; rank 0 binds it a moment later.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port on 127.0.0.1 for the master: %w (pass -master 127.0.0.1:PORT)", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("releasing the free port %d: %w", port, err)
	}
	return port, nil
}

// runRun is `tandem run`: it parses the flags, passes SIGINT and SIGTERM on
// to the workers and returns an error whose ExitCode is the job's status.
func runRun(ctx context.Context, args []string) error {
	cfg, err := parseRunFlags(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if cfg.elastic != nil {
		return runElastic(ctx, cfg, os.Stdout, os.Stderr, sigs)
	}
	if err := cfg.defaultMaster(); err != nil {
		return err
	}
	return runJob(ctx, cfg, os.Stdout, os.Stderr, sigs)
}

// runJob launches the workers and, while -max-restarts allows, launches
// them all again after a worker failed. A signal, a cancelled context or a
// worker that cannot be started ends the job without a restart.
func runJob(ctx context.Context, cfg runConfig, stdout, stderr io.Writer, signals <-chan os.Signal) error {
	for {
		err := startWorkers(ctx, cfg, stdout, stderr, signals)
		var ee *exitError
		if err == nil || cfg.restart >= cfg.maxRestarts || !errors.As(err, &ee) || !ee.workerFailed || ctx.Err() != nil {
			if err != nil && cfg.restart > 0 && errors.As(err, &ee) {
				ee.msg += fmt.Sprintf(" (after %s)", plural(cfg.restart, "restart"))
			}
			return err
		}
		cfg.restart++
		if cfg.autoMaster {
			// A fresh port: the last rank 0's may linger in TIME_WAIT.
			cfg.masterAddr = ""
			if perr := cfg.defaultMaster(); perr != nil {
				return errors.Join(err, perr)
			}
		}
		fmt.Fprintf(stderr, "tandem run: %v; restarting all %s (restart %d of %d)\n", err, plural(cfg.nproc, "worker"), cfg.restart, cfg.maxRestarts)
	}
}
