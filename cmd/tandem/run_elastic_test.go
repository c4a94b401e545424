//go:build unix

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/netns"
	"github.com/tandemml/tandem/internal/testlog"
	"gorgonia.org/tensor"
)

// The tests below run elastic `tandem run`: a `tandem store` process and
// several `tandem run -rdzv-endpoint` processes (this test binary acting as
// tandem, see TestHelperTandem), each with its own -rdzv-node-id, on
// loopback.

const (
	elasticToken = "elastic-test-token"
	// elasticWorkerEnv names the directory where TestHelperElasticWorker
	// reports and looks for its stop file.
	elasticWorkerEnv = "TANDEM_TEST_ELASTIC_DIR"
	// elasticWait bounds each wait for a round's workers (race-enabled
	// processes starting on a loaded machine).
	elasticWait = 45 * time.Second
)

// TestHelperElasticWorker is not a test: it is a worker of an elastic
// `tandem run`. It joins its round's world with comm.InitFromEnv (through
// the rendezvous store, under the round's prefix), sums the ranks with an
// all-reduce, writes "world=W restart=N sum=S" to round<N>-rank<R> in
// $TANDEM_TEST_ELASTIC_DIR, and then waits for the file "stop" there, or
// for the launcher's SIGTERM.
func TestHelperElasticWorker(t *testing.T) {
	dir := os.Getenv(elasticWorkerEnv)
	if dir == "" || os.Getenv("RANK") == "" {
		return
	}
	if err := elasticWorker(dir); err != nil {
		fmt.Fprintln(os.Stderr, "elastic worker:", err)
		os.Exit(1)
	}
}

func elasticWorker(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, err := comm.InitFromEnv(ctx, comm.WithoutDefault())
	if err != nil {
		return err
	}
	defer pg.Close()
	x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{float64(pg.Rank())}))
	if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	restart := os.Getenv("TANDEM_RESTART_COUNT")
	name := filepath.Join(dir, fmt.Sprintf("round%s-rank%d", restart, pg.Rank()))
	line := fmt.Sprintf("world=%d restart=%s sum=%g", pg.Size(), restart, x.Data().([]float64)[0])
	if err := os.WriteFile(name+".tmp", []byte(line), 0o600); err != nil {
		return err
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		return err
	}
	for ctx.Err() == nil {
		if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
			// Every rank leaves together: nobody closes its links while
			// another still reads them.
			return pg.Barrier(ctx).Wait(ctx)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return ctx.Err()
}

// elasticStore starts `tandem store` on a free loopback port and returns its
// address; it is stopped when the test ends.
func elasticStore(t *testing.T, addr string) string {
	t.Helper()
	cmd, out, errOut := tandemProcess(t, "store", "-addr", addr)
	cmd.Env = append(cmd.Env, "TANDEM_TOKEN="+elasticToken)
	mustNoErr(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	re := regexp.MustCompile(`listening on (\S+) `)
	deadline := time.Now().Add(elasticWait)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("tandem store never said where it listens; stderr: %s", errOut)
	return ""
}

// elasticAgent is one `tandem run -rdzv-endpoint` process.
type elasticAgent struct {
	id     string
	cmd    *exec.Cmd
	stderr *testlog.Buffer
	exited chan error
}

// startAgent starts node id's `tandem run` with args (the flags before
// "--") and env added; it is killed if still running when the test ends.
func startAgent(t *testing.T, id string, env []string, args ...string) *elasticAgent {
	t.Helper()
	return startAgentOn(t, nil, id, env, args...)
}

// startAgentOn is startAgent inside host (on this machine's network when
// host is nil).
func startAgentOn(t *testing.T, host *netns.Host, id string, env []string, args ...string) *elasticAgent {
	t.Helper()
	cmd, _, errOut := tandemProcess(t, append([]string{"run", "-rdzv-node-id", id}, args...)...)
	if host != nil {
		in := host.Command(t.Context(), cmd.Path, cmd.Args[1:]...)
		in.Env, in.Stdout, in.Stderr = cmd.Env, cmd.Stdout, cmd.Stderr
		cmd = in
	}
	cmd.Env = append(append(cmd.Env, "TANDEM_TOKEN="+elasticToken), env...)
	mustNoErr(t, cmd.Start())
	a := &elasticAgent{id: id, cmd: cmd, stderr: errOut, exited: make(chan error, 1)}
	go func() { a.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-a.exited
		if t.Failed() {
			t.Logf("node %s's stderr:\n%s", id, errOut)
		}
	})
	return a
}

// wait waits for the agent to exit and returns its exit status, 128+N if
// signal N killed it.
func (a *elasticAgent) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-a.exited:
		a.exited <- err // for the cleanup
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("node %s: %v", a.id, err)
		}
		if ee != nil {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ee.ExitCode()
		}
		return 0
	case <-time.After(elasticWait):
		t.Fatalf("node %s still runs after %v; stderr:\n%s", a.id, elasticWait, a.stderr)
		return -1
	}
}

// runID makes a fresh run id.
func runID(t *testing.T) string {
	b := make([]byte, 4)
	_, err := rand.Read(b)
	mustNoErr(t, err)
	return "job-" + hex.EncodeToString(b)
}

// waitRound waits until ranks 0..world-1 of round n reported in dir, and
// checks that each saw that world size and restart count, and the sum of
// the ranks from the all-reduce over the round's world.
func waitRound(t *testing.T, dir string, n, world int) {
	t.Helper()
	deadline := time.Now().Add(elasticWait)
	want := fmt.Sprintf("world=%d restart=%d sum=%d", world, n, world*(world-1)/2)
	for r := range world {
		name := filepath.Join(dir, fmt.Sprintf("round%d-rank%d", n, r))
		for {
			b, err := os.ReadFile(name)
			if err == nil {
				checkEqual(t, want, string(b), "rank %d of round %d", r, n)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d of round %d never reported (%s)", r, n, name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// No rank beyond the world reported.
	_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("round%d-rank%d", n, world)))
	checkTrue(t, errors.Is(err, os.ErrNotExist), "round %d has a rank %d: %v", n, world, err)
}

// elasticJobShrinksAndGrows runs three nodes of `tandem run -nnodes 2:3`
// whose workers meet through the store at storeAddr; start starts node id.
// It kills one node (SIGKILL): the others form a round of two nodes; it
// starts that node again: a round of three. Then the workers finish and
// every node exits 0.
func elasticJobShrinksAndGrows(t *testing.T, dir, run string, nproc int, start func(id string) *elasticAgent) {
	a, b, c := start("a"), start("b"), start("c")
	waitRound(t, dir, 0, 3*nproc)

	killed := time.Now()
	mustNoErr(t, c.cmd.Process.Kill())
	checkEqual(t, 128+int(syscall.SIGKILL), c.wait(t))
	waitRound(t, dir, 1, 2*nproc)
	t.Logf("node c killed: round 1 (world %d) trained %v later", 2*nproc, time.Since(killed).Round(time.Millisecond))

	back := time.Now()
	c2 := start("c")
	waitRound(t, dir, 2, 3*nproc)
	t.Logf("node c started again: round 2 (world %d) trained %v later", 3*nproc, time.Since(back).Round(time.Millisecond))

	mustNoErr(t, os.WriteFile(filepath.Join(dir, "stop"), nil, 0o600))
	for _, n := range []*elasticAgent{a, b, c2} {
		checkEqual(t, 0, n.wait(t), "node %s's exit status; stderr:\n%s", n.id, n.stderr)
	}
	for _, n := range []*elasticAgent{a, b} {
		log := n.stderr.String()
		checkMatch(t, regexp.MustCompile(fmt.Sprintf(`(?m)^tandem run: round 0 of run %s: world size %d: 3 nodes \([abc], [abc], [abc]\)`, run, 3*nproc)), log)
		checkContains(t, log, fmt.Sprintf("tandem run: round 0 ends: node c lost: no heartbeat for 3s; stopping this node's %s", plural(nproc, "worker")))
		checkContains(t, log, fmt.Sprintf("tandem run: restart 1 of 5 (round 1 of run %s): node c lost: no heartbeat for 3s; new world size %d: 2 nodes", run, 2*nproc))
		checkContains(t, log, "tandem run: round 1 ends: node c waiting to join")
		checkContains(t, log, fmt.Sprintf("tandem run: restart 2 of 5 (round 2 of run %s): node c waiting to join; new world size %d: 3 nodes", run, 3*nproc))
	}
	// The node that came back joined at round 2, last.
	checkMatch(t, fmt.Sprintf(`new world size %d: 3 nodes \([ab], [ab], c\); node c is node rank 2,`, 3*nproc), c2.stderr.String())
}

// Losing a node shrinks the job, restoring it grows it again; the restarts
// are counted (TANDEM_RESTART_COUNT) and logged with their reason and world
// size. The workers meet through the rendezvous store, under a fresh prefix
// each round.
func TestRunElasticShrinksAndGrows(t *testing.T) {
	dir := t.TempDir()
	storeAddr := elasticStore(t, "127.0.0.1:0")
	run := runID(t)
	elasticJobShrinksAndGrows(t, dir, run, 2, func(id string) *elasticAgent {
		return startAgent(t, id, []string{elasticWorkerEnv + "=" + dir},
			"-nproc", "2", "-nnodes", "2:3", "-rdzv-endpoint", storeAddr, "-rdzv-id", run,
			"-rdzv-last-call", "1s", "-max-restarts", "5", "-grace", "2s",
			"--", os.Args[0], "-test.run=^TestHelperElasticWorker$")
	})
	// A node that comes after the run completed finds nothing to do.
	late := startAgent(t, "d", nil, "-nnodes", "2:3", "-rdzv-endpoint", storeAddr, "-rdzv-id", run, "--", "false")
	checkEqual(t, 0, late.wait(t))
	checkContains(t, late.stderr.String(), fmt.Sprintf("node d: run %s is already complete; nothing to do", run))
}

// The same across three network namespaces acting as hosts, joined by a
// bridge: the store runs in the root namespace, each node's launcher and
// workers in its own host, and the workers' TCP backend meets over the
// hosts' own addresses.
func TestRunElasticAcrossNamespaces(t *testing.T) {
	net := netns.New(t, 3)
	dir := t.TempDir()
	storeAddr := elasticStore(t, net.RootAddr()+":0")
	run := runID(t)
	hosts := map[string]*netns.Host{"a": net.Host(0), "b": net.Host(1), "c": net.Host(2)}
	elasticJobShrinksAndGrows(t, dir, run, 1, func(id string) *elasticAgent {
		return startAgentOn(t, hosts[id], id, []string{elasticWorkerEnv + "=" + dir},
			"-nproc", "1", "-nnodes", "2:3", "-rdzv-endpoint", storeAddr, "-rdzv-id", run,
			"-rdzv-last-call", "1s", "-max-restarts", "5", "-grace", "2s",
			"--", os.Args[0], "-test.run=^TestHelperElasticWorker$")
	})
}

// elasticShellWorker reports RANK, WORLD_SIZE and TANDEM_RESTART_COUNT to
// $1/rRESTART-RANK; in round 0, rank 1 fails with status 3 while the others
// wait to be stopped; in later rounds every worker exits 0.
const elasticShellWorker = `echo "$RANK $WORLD_SIZE $TANDEM_RESTART_COUNT" > "$1/r$TANDEM_RESTART_COUNT-$RANK"
if [ "$TANDEM_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi
  exec sleep 30
fi`

// A failed worker on one node ends the round on every node: both start
// again with the restart counted, and finish.
func TestRunElasticWorkerFailureRestartsEveryNode(t *testing.T) {
	dir := t.TempDir()
	storeAddr := elasticStore(t, "127.0.0.1:0")
	run := runID(t)
	var agents []*elasticAgent
	for _, id := range []string{"n1", "n2"} {
		agents = append(agents, startAgent(t, id, nil, "-nnodes", "2", "-rdzv-endpoint", storeAddr, "-rdzv-id", run,
			"-max-restarts", "1", "-grace", "2s", "--", "sh", "-c", elasticShellWorker, "sh", dir))
	}
	for _, a := range agents {
		checkEqual(t, 0, a.wait(t), "node %s's exit status; stderr:\n%s", a.id, a.stderr)
	}
	for _, f := range []string{"r0-0", "r0-1", "r1-0", "r1-1"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		mustNoErr(t, err)
		checkEqual(t, fmt.Sprintf("%c 2 %c", f[3], f[1]), strings.TrimSpace(string(b)), f)
	}
	failure := regexp.MustCompile(`worker 1 on node (n1|n2) exited with code 3`)
	for _, a := range agents {
		checkMatch(t, regexp.MustCompile(`(?m)^tandem run: restart 1 of 1 \(round 1 of run `+run+`\): `+failure.String()+`; new world size 2: 2 nodes`), a.stderr.String())
	}
}

// With the restarts used up, a failure ends the run on every node, each
// with a non-zero status and a message saying why.
func TestRunElasticRestartsExhausted(t *testing.T) {
	dir := t.TempDir()
	storeAddr := elasticStore(t, "127.0.0.1:0")
	run := runID(t)
	var agents []*elasticAgent
	for _, id := range []string{"n1", "n2"} {
		agents = append(agents, startAgent(t, id, nil, "-nnodes", "2", "-rdzv-endpoint", storeAddr, "-rdzv-id", run,
			"-grace", "2s", "--", "sh", "-c", elasticShellWorker, "sh", dir))
	}
	codes := map[int]int{}
	for _, a := range agents {
		code := a.wait(t)
		codes[code]++
		checkMatch(t, regexp.MustCompile(`run failed: round 0 of run `+run+` ended \(worker 1 on node n[12] exited with code 3\), and the 0 restarts allowed are used up`), a.stderr.String())
	}
	// The failed worker's node exits with its status; the other with 1.
	checkEqual(t, map[int]int{3: 1, 1: 1}, codes)
}

// A round that cannot gather MIN nodes within the join timeout fails.
func TestRunElasticJoinTimeout(t *testing.T) {
	storeAddr := elasticStore(t, "127.0.0.1:0")
	a := startAgent(t, "alone", nil, "-nnodes", "2:3", "-rdzv-endpoint", storeAddr, "-rdzv-id", runID(t),
		"-rdzv-join-timeout", "1s", "--", "true")
	checkEqual(t, 1, a.wait(t))
	checkContains(t, a.stderr.String(), "did not form within the join timeout 1s: 1 of at least 2 nodes joined (alone)")
}

func TestRunElasticFlags(t *testing.T) {
	env := func(string) string { return "tok" }
	cfg, err := parseRunFlags([]string{"-nproc", "2", "-nnodes", "2:4", "-rdzv-endpoint", "st:29400", "-rdzv-id", "j1", "-rdzv-node-id", "n7", "-max-restarts", "3", "--", "true"}, env, io.Discard)
	mustNoErr(t, err)
	checkTrue(t, cfg.elastic != nil, "not elastic")
	checkEqual(t, "st 29400 j1 n7 2 4", fmt.Sprintf("%s %d %s %s %d %d", cfg.elastic.host, cfg.elastic.port, cfg.elastic.runID, cfg.elastic.nodeID, cfg.elastic.minNodes, cfg.elastic.maxNodes))
	checkEqual(t, 3, cfg.maxRestarts)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-nnodes", "2:3", "true"}, "a range of nodes needs an elastic job"},
		{[]string{"-nnodes", "3:2", "-rdzv-endpoint", "h:1", "-rdzv-id", "j", "true"}, "-nnodes 3:2: want 1 <= MIN <= MAX"},
		{[]string{"-nnodes", "x", "true"}, "want a number of nodes N or a range MIN:MAX"},
		{[]string{"-nnodes", "2:3", "-rdzv-endpoint", "h:1", "true"}, "needs -rdzv-id RUNID"},
		{[]string{"-nnodes", "2:3", "-rdzv-endpoint", "h", "-rdzv-id", "j", "true"}, `-rdzv-endpoint "h": want HOST:PORT`},
		{[]string{"-nnodes", "2:3", "-rdzv-endpoint", "h:1", "-rdzv-id", "j", "-node-rank", "1", "true"}, "-node-rank with -rdzv-endpoint"},
		{[]string{"-nnodes", "2:3", "-rdzv-endpoint", "h:1", "-rdzv-id", "j", "-master", "h:2", "true"}, "-master with -rdzv-endpoint"},
	} {
		_, err := parseRunFlags(c.args, env, io.Discard)
		checkErrorIs(t, err, errs.InvalidArgument, "%q", c.args)
		checkErrorContains(t, err, c.want, "%q", c.args)
	}
	_, err = parseRunFlags([]string{"-nnodes", "2:3", "-rdzv-endpoint", "h:1", "-rdzv-id", "j", "true"}, noEnv, io.Discard)
	checkContains(t, fmt.Sprint(err), "needs the token of its `tandem store`")
}
