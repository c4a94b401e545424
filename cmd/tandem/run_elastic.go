package main

// Elastic `tandem run`: with -rdzv-endpoint, the launchers of all nodes meet
// in a `tandem store` (launch.Rendezvous) and agree, round by round, on the
// nodes of the job and their ranks. Each round's workers are started with
// that round's ranks and world size; a failed worker, a lost node or a node
// waiting to join ends the round on every node, and the agents meet again.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/launch"
)

// nodeRange is the value of -nnodes: N, or MIN:MAX for an elastic job.
type nodeRange struct{ min, max int }

func (n *nodeRange) String() string {
	if n == nil || n.min == n.max {
		if n == nil {
			return "1"
		}
		return strconv.Itoa(n.max)
	}
	return fmt.Sprintf("%d:%d", n.min, n.max)
}

// Set reads N or MIN:MAX; the ranges are checked once every flag is read.
func (n *nodeRange) Set(s string) error {
	lo, hi, isRange := strings.Cut(s, ":")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return fmt.Errorf("want a number of nodes N or a range MIN:MAX, as in 2 or 2:4")
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(hi); err != nil {
			return fmt.Errorf("want a number of nodes N or a range MIN:MAX, as in 2 or 2:4")
		}
	}
	n.min, n.max = a, b
	return nil
}

// elasticConfig is what the -rdzv-* flags of `tandem run` ask for.
type elasticConfig struct {
	endpoint    string // host:port of the `tandem store`
	host        string
	port        int
	runID       string
	nodeID      string
	minNodes    int
	maxNodes    int
	lastCall    time.Duration
	joinTimeout time.Duration
}

// addElasticFlags adds the -rdzv-* flags to fs.
func addElasticFlags(fs *flag.FlagSet) *elasticConfig {
	e := &elasticConfig{}
	fs.StringVar(&e.endpoint, "rdzv-endpoint", "", "elastic job: `host:port` of the `tandem store` where the nodes' launchers meet (every node's, the same)")
	fs.StringVar(&e.runID, "rdzv-id", "", "elastic job: the run's `name`, the same on every node; its keys in the store live under it")
	fs.StringVar(&e.nodeID, "rdzv-node-id", "", "elastic job: this node's `name`, unique among the nodes (default HOSTNAME-PID)")
	fs.DurationVar(&e.lastCall, "rdzv-last-call", launch.DefaultLastCall, "elastic job: how long a round with MIN nodes (fewer than MAX) waits for more")
	fs.DurationVar(&e.joinTimeout, "rdzv-join-timeout", launch.DefaultJoinTimeout, "elastic job: how long a round may take to gather MIN nodes before tandem run gives up")
	return e
}

// setElastic checks an elastic command line and makes c an elastic job.
func (c *runConfig) setElastic(fs *flag.FlagSet, nodes nodeRange, e *elasticConfig, getenv func(string) string) error {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "node-rank" || f.Name == "master" {
			given = append(given, "-"+f.Name)
		}
	})
	switch {
	case len(given) > 0:
		return badUsage("%s with -rdzv-endpoint: the rendezvous assigns node ranks, and the workers meet in the rendezvous store; leave %s out", strings.Join(given, " and "), strings.Join(given, " and "))
	case len(c.argv) == 0:
		return badUsage("no command to run: write it after the flags, as in tandem run -nnodes 2:3 -rdzv-endpoint store:29400 -rdzv-id job1 -- ./train")
	case c.nproc < 1:
		return badUsage("-nproc %d: need at least 1 worker per node", c.nproc)
	case nodes.min < 1 || nodes.max < nodes.min:
		return badUsage("-nnodes %s: want 1 <= MIN <= MAX", &nodes)
	case e.runID == "" || strings.ContainsAny(e.runID, "/ \t\n"):
		return badUsage("-rdzv-endpoint needs -rdzv-id RUNID, a name without slashes or spaces that every node of the job gives alike (a new one for each job)")
	case strings.ContainsAny(e.nodeID, "/ \t\n"):
		return badUsage("-rdzv-node-id %q: want a name without slashes or spaces", e.nodeID)
	case e.lastCall < 0 || e.joinTimeout <= 0:
		return badUsage("-rdzv-last-call %v, -rdzv-join-timeout %v: the last call must not be negative and the join timeout must be positive", e.lastCall, e.joinTimeout)
	case c.grace < 0:
		return badUsage("-grace %v: must not be negative", c.grace)
	case c.maxRestarts < 0:
		return badUsage("-max-restarts %d: must not be negative", c.maxRestarts)
	}
	if c.metrics != "" {
		if _, err := launch.WorkerMetricsAddr(c.metrics, c.nproc-1); err != nil {
			return &usageError{fmt.Errorf("-metrics-addr: %w", err)}
		}
	}
	host, port, err := net.SplitHostPort(e.endpoint)
	if err != nil || host == "" {
		return badUsage("-rdzv-endpoint %q: want HOST:PORT of a `tandem store` that every node reaches, as in store0:29400", e.endpoint)
	}
	e.port, err = strconv.Atoi(port)
	if err != nil || e.port < 1 || e.port > 65535 {
		return badUsage("-rdzv-endpoint %q: port %q is not a number from 1 to 65535", e.endpoint, port)
	}
	e.host = host
	if e.nodeID == "" {
		name, err := os.Hostname()
		if err != nil || name == "" {
			name = "node"
		}
		e.nodeID = strings.NewReplacer("/", "_", " ", "_").Replace(name) + "-" + strconv.Itoa(os.Getpid())
	}
	e.minNodes, e.maxNodes = nodes.min, nodes.max
	if c.token == "" {
		c.token = getenv(tokenEnv)
	}
	if c.token == "" {
		return badUsage("-rdzv-endpoint needs the token of its `tandem store`: set TANDEM_TOKEN (or -token) to the same secret on every node and for the store")
	}
	c.elastic = e
	c.runID = e.runID
	c.masterAddr, c.masterPort = e.host, e.port
	c.nnodes = nodes.max
	return nil
}

// errNewRound is why an elastic round's workers are stopped when another
// round must start.
var errNewRound = errors.New("a new rendezvous round starts")

// storeCallTimeout bounds each call to the rendezvous store, so that an
// agent whose store went away fails instead of waiting for minutes.
const storeCallTimeout = 30 * time.Second

// watched is what Rendezvous.Watch returned.
type watched struct {
	change launch.Change
	err    error
}

// runElastic is an elastic `tandem run`: it meets the other nodes' agents
// at the rendezvous store, runs each round's workers, and starts a new round
// when a worker fails (here or on another node), a node is lost or a node
// waits to join, until every worker of a round exits 0 (nil), the restarts
// run out or a round cannot form (an error whose ExitCode is the status).
func runElastic(ctx context.Context, cfg runConfig, stdout, stderr io.Writer, signals <-chan os.Signal) error {
	e := cfg.elastic
	logW := &lockedWriter{w: stderr}
	notef := func(format string, a ...any) {
		_, _ = logW.Write([]byte("tandem run: " + fmt.Sprintf(format, a...) + "\n"))
	}
	failf := func(code int, err error, format string, a ...any) error {
		return &exitError{code: code, err: err, msg: fmt.Sprintf(format, a...)}
	}

	dctx, cancel := context.WithTimeout(ctx, e.joinTimeout)
	st, err := store.Dial(dctx, e.endpoint, store.WithToken(cfg.token), store.WithTimeout(storeCallTimeout))
	cancel()
	if err != nil {
		return failf(1, err, "node %s: cannot reach the rendezvous store at %s: %v (is `tandem store` running there, with the same TANDEM_TOKEN?)", e.nodeID, e.endpoint, err)
	}
	defer st.Close()
	rz, err := launch.NewRendezvous(st, launch.RendezvousConfig{
		RunID: e.runID, NodeID: e.nodeID, MinNodes: e.minNodes, MaxNodes: e.maxNodes,
		MaxRestarts: cfg.maxRestarts, JoinTimeout: e.joinTimeout, LastCall: e.lastCall,
		// Live nodes of the last round rejoin once they have stopped their
		// workers: -grace, then at worst killWait after SIGKILL.
		RejoinWait: cfg.grace + killWait + 5*time.Second,
	})
	if err != nil {
		return &usageError{err}
	}
	defer rz.Close()

	var pending launch.Change // the change that ended the last round, for its log line
	for {
		round, err := rz.Join(ctx)
		switch {
		case errors.Is(err, launch.ErrRunComplete):
			notef("node %s: run %s is already complete; nothing to do", e.nodeID, e.runID)
			return nil
		case err != nil && ctx.Err() != nil:
			return failf(interruptCode(signals), err, "node %s: stopped while joining run %s: %v", e.nodeID, e.runID, context.Cause(ctx))
		case err != nil:
			return failf(1, err, "node %s: %v", e.nodeID, err)
		}
		c := cfg
		c.nnodes, c.nodeRank, c.restart = round.NumNodes(), round.NodeRank, round.Number
		c.storePrefix = round.StorePrefix
		first, last := c.rank(0), c.rank(c.nproc-1)
		members := fmt.Sprintf("%s (%s); node %s is node rank %d, ranks %d-%d",
			plural(round.NumNodes(), "node"), strings.Join(round.Nodes, ", "), e.nodeID, round.NodeRank, first, last)
		if round.Number == 0 {
			notef("round 0 of run %s: world size %d: %s", e.runID, c.worldSize(), members)
		} else {
			reason := round.Reason
			if reason == "" {
				reason = pending.Reason
			}
			notef("restart %d of %d (round %d of run %s): %s; new world size %d: %s",
				round.Number, cfg.maxRestarts, round.Number, e.runID, reason, c.worldSize(), members)
		}

		wctx, stopWorkers := context.WithCancelCause(ctx)
		workersDone := make(chan error, 1)
		go func() { workersDone <- startWorkers(wctx, c, stdout, stderr, signals) }()
		watchCtx, stopWatch := context.WithCancel(ctx)
		watchDone := make(chan watched, 1)
		go func() {
			ch, err := rz.Watch(watchCtx, round)
			watchDone <- watched{ch, err}
		}()

		var werr error
		var w watched
		select {
		case werr = <-workersDone:
			stopWatch()
			w = <-watchDone
			if w.err != nil && watchCtx.Err() != nil {
				w = watched{} // stopped here, not a verdict
			}
		case w = <-watchDone:
			stopWatch()
			switch {
			case w.err != nil:
				stopWorkers(w.err)
			case w.change.Done:
				// The run completed (every member finished, so this node's
				// workers are on their way out): let them end.
			default:
				notef("round %d ends: %s; stopping this node's %s", round.Number, w.change.Reason, plural(c.nproc, "worker"))
				stopWorkers(errNewRound)
			}
			werr = <-workersDone
		}
		stopWorkers(nil)
		if ctx.Err() != nil {
			if werr == nil {
				werr = failf(interruptCode(signals), ctx.Err(), "node %s: stopped: %v", e.nodeID, context.Cause(ctx))
			}
			return werr
		}
		if w.err != nil {
			return failf(1, w.err, "node %s: %v", e.nodeID, w.err)
		}

		var ee *exitError
		switch {
		case w.change.Done:
			return werr // the run is complete; a late failure here is still reported
		case w.change.Next > round.Number:
			pending = w.change
			if werr != nil && !errors.Is(werr, errNewRound) && !(errors.As(werr, &ee) && ee.workerFailed) {
				return werr // a signal to tandem run, a worker that could not start
			}
			continue
		case werr == nil:
			ch, err := rz.Finish(ctx, round)
			if err != nil {
				return failf(1, err, "node %s: this node's workers finished, but: %v", e.nodeID, err)
			}
			if ch.Done {
				return nil
			}
			pending = ch
			notef("round %d ends: %s; this node's workers had finished, they start again", round.Number, ch.Reason)
		case errors.As(werr, &ee) && ee.workerFailed:
			reason := fmt.Sprintf("worker %d on node %s %s", ee.failedRank, e.nodeID, ee.failedHow)
			notef("round %d ends: %s", round.Number, reason)
			ch, err := rz.Restart(ctx, round, reason)
			switch {
			case errors.Is(err, launch.ErrRunFailed):
				ee.msg = fmt.Sprintf("node %s: %v", e.nodeID, err)
				return ee
			case err != nil:
				return failf(1, err, "node %s: %s, and opening the next round failed: %v", e.nodeID, reason, err)
			case ch.Done:
				return werr // the other nodes completed the run
			}
			pending = ch
		default:
			return werr // a signal, a worker that could not start: this node leaves
		}
	}
}

// interruptCode is the exit status after a signal cut an elastic agent
// short: 128+N for the signal waiting on signals, else 1.
func interruptCode(signals <-chan os.Signal) int {
	select {
	case sig := <-signals:
		if sn, ok := sig.(syscall.Signal); ok {
			return 128 + int(sn)
		}
	default:
	}
	return 1
}
