//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/launch"
)

// noEnv is a getenv that finds nothing.
func noEnv(string) string { return "" }

// launchArgs parses args as `tandem run` would and runs the job in this
// process, returning its stdout, stderr and result.
func launchArgs(t *testing.T, ctx context.Context, signals <-chan os.Signal, args ...string) (string, string, error) {
	t.Helper()
	cfg, err := parseRunFlags(args, noEnv, io.Discard)
	mustNoErr(t, err)
	mustNoErr(t, cfg.defaultMaster())
	var out, errOut testlog.Buffer
	err = startWorkers(ctx, cfg, &out, &errOut, signals)
	return out.String(), errOut.String(), err
}

// sortedLines splits output into its lines, sorted.
func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	sort.Strings(lines)
	return lines
}

// exitCodeOf is the status tandem would exit with for err.
func exitCodeOf(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var ec exitCoder
	mustTrue(t, errors.As(err, &ec), "error %v carries no exit code", err)
	return ec.ExitCode()
}

// markerScript is the tail of a worker script: it starts a background
// `sleep 30` (a child in the worker's process group), records the shell's
// and the sleep's pids in $1/RANK, and waits. Tests read the file to check
// that both processes were stopped.
const markerScript = `sleep 30 & echo "$$ $!" > "$1/$RANK.tmp" && mv "$1/$RANK.tmp" "$1/$RANK"; wait`

// waitMarkers is a worker script fragment that waits (at most 10 s) until
// every listed rank has written its marker.
func waitMarkers(ranks ...int) string {
	var conds []string
	for _, r := range ranks {
		conds = append(conds, fmt.Sprintf(`[ -e "$1/%d" ]`, r))
	}
	return fmt.Sprintf(`i=0; until { %s; } || [ $i -ge 500 ]; do sleep 0.02; i=$((i+1)); done; `, strings.Join(conds, " && "))
}

// markerPids reads the pids that the listed ranks recorded in dir.
func markerPids(t *testing.T, dir string, ranks ...int) []int {
	t.Helper()
	var pids []int
	for _, r := range ranks {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)))
		mustNoErr(t, err, "rank %d never wrote its marker", r)
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			mustNoErr(t, err)
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive says whether pid is a running process. A zombie counts as gone: it
// has exited and only waits for a parent to collect it.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if _, statErr := os.Stat("/proc/self/stat"); statErr != nil {
			return syscall.Kill(pid, 0) == nil // no /proc here
		}
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	state := b[i+2]
	return state != 'Z' && state != 'X'
}

// requireGone waits (at most 5 s, for signals in flight) until none of pids
// runs any more, and fails naming those that still do.
func requireGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			t.Fatalf("processes %v are still running after the launcher returned", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunPrefixesEachRanksLines(t *testing.T) {
	before := runtime.NumGoroutine()
	out, errOut, err := launchArgs(t, context.Background(), nil,
		"-nproc", "3", "--", "sh", "-c", `echo $RANK/$WORLD_SIZE; echo "to stderr $RANK" >&2; printf 'no newline %s' $RANK`)
	mustNoErr(t, err)
	checkEqual(t, []string{
		"[0] 0/3", "[0] no newline 0",
		"[1] 1/3", "[1] no newline 1",
		"[2] 2/3", "[2] no newline 2",
	}, sortedLines(out))
	checkEqual(t, []string{"[0] to stderr 0", "[1] to stderr 1", "[2] to stderr 2"}, sortedLines(errOut))
	testkit.RequireNoLeak(t, before)
}

func TestRunNoPrefixPassesOutputThrough(t *testing.T) {
	out, _, err := launchArgs(t, context.Background(), nil,
		"-nproc", "2", "-no-prefix", "--", "sh", "-c", `echo "rank $RANK"`)
	mustNoErr(t, err)
	checkEqual(t, []string{"rank 0", "rank 1"}, sortedLines(out))
}

func TestRunLongLinesAndManyLinesStayWhole(t *testing.T) {
	// Each worker writes 200 lines of 3000 characters of its own digit
	// (so many that the pipe fills and the writes interleave) and one line
	// longer than the prefix writer holds back.
	script := `i=0; line=$(printf "%3000s" "" | tr " " "$RANK"); while [ $i -lt 200 ]; do echo "$line"; i=$((i+1)); done; ` +
		`printf "%70000s\n" "" | tr " " "$RANK"`
	out, _, err := launchArgs(t, context.Background(), nil, "-nproc", "3", "--", "sh", "-c", script)
	mustNoErr(t, err)
	long := map[string]int{}
	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		mustMatch(t, `^\[[0-2]\] `, line)
		rank, body := line[1:2], line[4:]
		mustEqual(t, strings.Repeat(rank, len(body)), body, "a line of rank %s has foreign bytes", rank)
		if len(body) == 3000 {
			count[rank]++
		} else {
			long[rank] += len(body)
		}
	}
	for _, r := range []string{"0", "1", "2"} {
		checkEqual(t, 200, count[r], "rank %s", r)
		checkEqual(t, 70000, long[r], "rank %s: the long line's pieces", r)
	}
}

func TestRunSetsWorkerEnvironment(t *testing.T) {
	t.Setenv("RANK", "99")                          // overridden
	t.Setenv("TANDEM_RUN_TEST_INHERITED", "passed") // inherited
	out, _, err := launchArgs(t, context.Background(), nil, "-nproc", "3", "--", "sh", "-c",
		`echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $TANDEM_TOKEN $TANDEM_RUN_TEST_INHERITED`)
	mustNoErr(t, err)
	lines := sortedLines(out)
	mustEqual(t, 3, len(lines))
	var port, token string
	for i, line := range lines {
		f := strings.Fields(line)
		mustEqual(t, 10, len(f), "line %q", line)
		r := strconv.Itoa(i)
		checkEqual(t, []string{"[" + r + "]", r, "3", r, "3", "0", "127.0.0.1"}, f[:7])
		checkEqual(t, "passed", f[9])
		if i == 0 {
			port, token = f[7], f[8]
		}
		checkEqual(t, port, f[7], "every rank gets the same MASTER_PORT")
		checkEqual(t, token, f[8], "every rank gets the same TANDEM_TOKEN")
	}
	p, err := strconv.Atoi(port)
	mustNoErr(t, err)
	checkTrue(t, p > 0 && p < 65536, "MASTER_PORT %d", p)
	checkMatch(t, `^[0-9a-f]{32}$`, token, "a generated token is 128 random bits in hex")
	// The port was free: nobody listens there now that the job is done.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	mustNoErr(t, err, "MASTER_PORT %s was not a free port", port)
	mustNoErr(t, l.Close())
}

func TestRunTokenComesFromFlagOrEnvironment(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == tokenEnv {
				return v
			}
			return ""
		}
	}
	cfg, err := parseRunFlags([]string{"-token", "fromflag", "true"}, env("fromenv"), io.Discard)
	mustNoErr(t, err)
	checkEqual(t, "fromflag", cfg.token)
	cfg, err = parseRunFlags([]string{"true"}, env("fromenv"), io.Discard)
	mustNoErr(t, err)
	checkEqual(t, "fromenv", cfg.token)
	cfg, err = parseRunFlags([]string{"-nnodes", "2", "-master", "h:1", "true"}, env("fromenv"), io.Discard)
	mustNoErr(t, err)
	checkEqual(t, "fromenv", cfg.token)
	a, err := parseRunFlags([]string{"true"}, noEnv, io.Discard)
	mustNoErr(t, err)
	b, err := parseRunFlags([]string{"true"}, noEnv, io.Discard)
	mustNoErr(t, err)
	checkNotEqual(t, a.token, b.token, "each single-node job gets a fresh token")
}

func TestRunMultiNodeRankOffsets(t *testing.T) {
	out, _, err := launchArgs(t, context.Background(), nil,
		"-nproc", "2", "-nnodes", "2", "-node-rank", "1", "-master", "node0.example:29400", "-token", "s3cret",
		"--", "sh", "-c", `echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $TANDEM_TOKEN`)
	mustNoErr(t, err)
	checkEqual(t, []string{
		"[2] 2 4 0 2 1 node0.example 29400 s3cret",
		"[3] 3 4 1 2 1 node0.example 29400 s3cret",
	}, sortedLines(out))
}

func TestRunFailingWorkerStopsTheOthers(t *testing.T) {
	dir := t.TempDir()
	before := runtime.NumGoroutine()
	// Rank 1 fails once ranks 0 and 2 are up; a long grace means the others
	// must go on SIGTERM, or the test sees the SIGKILL notice.
	script := `if [ "$RANK" = 1 ]; then ` + waitMarkers(0, 2) + `exit 3; fi; ` + markerScript
	_, errOut, err := launchArgs(t, context.Background(), nil, "-nproc", "3", "-grace", "20s", "--", "sh", "-c", script, "sh", dir)
	mustErr(t, err)
	checkEqual(t, 3, exitCodeOf(t, err))
	checkMatch(t, `^rank 1 \(pid \d+\) exited with code 3; stopped the other 2 workers$`, err.Error())
	checkNotContains(t, errOut, "SIGKILL")
	requireGone(t, markerPids(t, dir, 0, 2))
	testkit.RequireNoLeak(t, before)
}

// runArgs is launchArgs through runJob, with -max-restarts honoured.
func runArgs(t *testing.T, ctx context.Context, args ...string) (string, string, error) {
	t.Helper()
	return runArgsSignals(t, ctx, nil, args...)
}

func runArgsSignals(t *testing.T, ctx context.Context, signals <-chan os.Signal, args ...string) (string, string, error) {
	t.Helper()
	cfg, err := parseRunFlags(args, noEnv, io.Discard)
	mustNoErr(t, err)
	mustNoErr(t, cfg.defaultMaster())
	var out, errOut testlog.Buffer
	err = runJob(ctx, cfg, &out, &errOut, signals)
	return out.String(), errOut.String(), err
}

// A signal to tandem run, or its context ending, stops the job for good:
// no restart, even with restarts left and a worker failing meanwhile.
func TestRunNoRestartAfterSignalOrCancel(t *testing.T) {
	dir := t.TempDir()
	sigs := make(chan os.Signal, 1)
	go func() {
		for i := 0; i < 500; i++ { // both workers up, or 10 s
			_, e0 := os.Stat(filepath.Join(dir, "0"))
			_, e1 := os.Stat(filepath.Join(dir, "1"))
			if e0 == nil && e1 == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		sigs <- syscall.SIGTERM
	}()
	// Each worker exits 7 on SIGTERM: a failure, but one the signal caused.
	script := `trap 'exit 7' TERM; ` + markerScript
	_, errOut, err := runArgsSignals(t, context.Background(), sigs, "-nproc", "2", "-max-restarts", "3", "--", "sh", "-c", script, "sh", dir)
	mustErr(t, err)
	checkEqual(t, 128+int(syscall.SIGTERM), exitCodeOf(t, err))
	checkNotContains(t, errOut, "restarting")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, errOut, err = runArgs(t, ctx, "-nproc", "2", "-max-restarts", "3", "--", "sleep", "30")
	mustErr(t, err)
	checkNotContains(t, errOut, "restarting")
}

// With -max-restarts a failed worker brings a restart of every worker, on a
// fresh port, with TANDEM_RESTART_COUNT counting; the job then succeeds.
func TestRunRestartsAfterFailure(t *testing.T) {
	script := `if [ "$TANDEM_RESTART_COUNT" -lt 2 ] && [ "$RANK" = 1 ]; then exit 3; fi; ` +
		`echo "rank $RANK restart $TANDEM_RESTART_COUNT of $TANDEM_MAX_RESTARTS port $MASTER_PORT"`
	out, errOut, err := runArgs(t, context.Background(), "-nproc", "2", "-max-restarts", "3", "--", "sh", "-c", script)
	mustNoErr(t, err)
	// Rank 0 may have printed in the failed starts too; rank 1 only in the
	// last. Both of the last start share a port that no earlier start had.
	ports := map[string][]string{} // by restart
	for _, l := range sortedLines(out) {
		m := regexp.MustCompile(`^\[(\d)\] rank (\d) restart (\d) of 3 port (\d+)$`).FindStringSubmatch(l)
		if m == nil || m[1] != m[2] || m[2] == "1" && m[3] != "2" {
			t.Fatalf("unexpected line %q in %q", l, out)
		}
		ports[m[3]] = append(ports[m[3]], m[4])
	}
	last := ports["2"]
	if len(last) != 2 || last[0] != last[1] {
		t.Fatalf("the last start: want both ranks on one port, got %q", out)
	}
	for r, ps := range ports {
		if r != "2" && ps[0] == last[0] {
			t.Errorf("restart %s used the last start's port %s too", r, ps[0])
		}
	}
	checkMatch(t, `(?m)^tandem run: rank 1 \(pid \d+\) exited with code 3(; stopped the other 1 worker)?; restarting all 2 workers \(restart 1 of 3\)$`, errOut)
	checkContains(t, errOut, "(restart 2 of 3)")
	checkNotContains(t, errOut, "(restart 3 of 3)")
}

// Restarts run out: the job fails with the last failure's code and says how
// many restarts it made; a job without -max-restarts is not restarted.
func TestRunRestartsRunOut(t *testing.T) {
	script := `if [ "$RANK" = 0 ]; then exit 4; fi; sleep 30`
	_, errOut, err := runArgs(t, context.Background(), "-nproc", "2", "-max-restarts", "2", "-grace", "5s", "--", "sh", "-c", script)
	mustErr(t, err)
	checkEqual(t, 4, exitCodeOf(t, err))
	checkMatch(t, `^rank 0 \(pid \d+\) exited with code 4; stopped the other 1 worker \(after 2 restarts\)$`, err.Error())
	checkContains(t, errOut, "(restart 2 of 2)")

	_, errOut, err = runArgs(t, context.Background(), "-nproc", "1", "--", "sh", "-c", "exit 5")
	checkEqual(t, 5, exitCodeOf(t, err))
	checkNotContains(t, errOut, "restarting")
}

func TestRunWorkerKilledBySignal(t *testing.T) {
	dir := t.TempDir()
	script := `if [ "$RANK" = 0 ]; then ` + waitMarkers(1) + `kill -KILL $$; fi; ` + markerScript
	_, _, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "-grace", "20s", "--", "sh", "-c", script, "sh", dir)
	mustErr(t, err)
	checkEqual(t, 128+9, exitCodeOf(t, err))
	checkMatch(t, `^rank 0 \(pid \d+\) was killed by signal 9 \(killed\); stopped the other 1 worker$`, err.Error())
	requireGone(t, markerPids(t, dir, 1))
}

func TestRunKillsWorkersThatIgnoreSIGTERM(t *testing.T) {
	dir := t.TempDir()
	// Both the shell and its sleep ignore SIGTERM; only SIGKILL ends them.
	script := `trap "" TERM; if [ "$RANK" = 0 ]; then ` + waitMarkers(1) + `exit 4; fi; ` + markerScript
	_, errOut, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "-grace", "200ms", "--", "sh", "-c", script, "sh", dir)
	mustErr(t, err)
	checkEqual(t, 4, exitCodeOf(t, err))
	checkMatch(t, `rank 1 \(pid \d+\) still running 200ms after it was told to stop; sending SIGKILL`, errOut)
	requireGone(t, markerPids(t, dir, 1))
}

func TestRunLeftoverChildOfFailedWorkerIsStopped(t *testing.T) {
	dir := t.TempDir()
	// The failing worker itself leaves a sleep behind in its group.
	script := `if [ "$RANK" = 0 ]; then sleep 30 & echo "$!" > "$1/0"; exit 5; fi; echo ok`
	_, _, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "--", "sh", "-c", script, "sh", dir)
	mustErr(t, err)
	checkEqual(t, 5, exitCodeOf(t, err))
	requireGone(t, markerPids(t, dir, 0))
}

func TestRunForwardsSignalToWorkers(t *testing.T) {
	dir := t.TempDir()
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		_, _, err := launchArgs(t, context.Background(), sigs, "-nproc", "2", "--", "sh", "-c", markerScript, "sh", dir)
		done <- err
	}()
	waitForFiles(t, dir, "0", "1")
	sigs <- syscall.SIGTERM
	err := <-done
	mustErr(t, err)
	checkEqual(t, 128+int(syscall.SIGTERM), exitCodeOf(t, err))
	checkEqual(t, "received terminated; stopped 2 workers", err.Error())
	requireGone(t, markerPids(t, dir, 0, 1))
}

func TestRunCancelledContextStopsWorkers(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := launchArgs(t, ctx, nil, "-nproc", "2", "--", "sh", "-c", markerScript, "sh", dir)
		done <- err
	}()
	waitForFiles(t, dir, "0", "1")
	cancel()
	err := <-done
	mustErr(t, err)
	checkErrorIs(t, err, context.Canceled)
	checkEqual(t, 1, exitCodeOf(t, err))
	requireGone(t, markerPids(t, dir, 0, 1))
}

func TestRunCommandNotFound(t *testing.T) {
	_, _, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "--", "/nonexistent/tandem-worker")
	mustErr(t, err)
	checkEqual(t, 127, exitCodeOf(t, err))
	checkContains(t, err.Error(), "/nonexistent/tandem-worker")
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "no command to run"},
		{[]string{"-nproc", "2"}, "no command to run"},
		{[]string{"-nproc", "0", "true"}, "-nproc 0"},
		{[]string{"-nnodes", "0", "true"}, "-nnodes 0"},
		{[]string{"-nnodes", "2", "-node-rank", "2", "-master", "h:1", "-token", "t", "true"}, "-node-rank 2 is out of range for -nnodes 2"},
		{[]string{"-node-rank", "-1", "true"}, "-node-rank -1 is out of range"},
		{[]string{"-nnodes", "2", "-node-rank", "1", "-token", "t", "true"}, "needs -master HOST:PORT"},
		{[]string{"-nnodes", "2", "-node-rank", "1", "-master", "h:1", "true"}, "needs a token shared by all nodes"},
		{[]string{"-master", "nohost", "true"}, "want HOST:PORT"},
		{[]string{"-master", ":29500", "true"}, "the host is missing"},
		{[]string{"-master", "h:99999", "true"}, "not a number from 1 to 65535"},
		{[]string{"-master", "h:port", "true"}, "not a number from 1 to 65535"},
		{[]string{"-grace", "-1s", "true"}, "-grace -1s"},
		{[]string{"-grace", "soon", "true"}, "invalid value"},
		{[]string{"-bogus", "true"}, "flag provided but not defined"},
		{[]string{"-max-restarts", "-1", "true"}, "-max-restarts -1"},
		{[]string{"-max-restarts", "1", "-nnodes", "2", "-master", "h:1", "-token", "t", "true"}, "single-node jobs only"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseRunFlags(tc.args, noEnv, io.Discard)
			mustErr(t, err)
			checkErrorIs(t, err, errs.InvalidArgument)
			checkContains(t, err.Error(), tc.want)
			checkEqual(t, 2, exitCodeOf(t, err))
		})
	}
	var help bytes.Buffer
	_, err := parseRunFlags([]string{"-h"}, noEnv, &help)
	checkErrorIs(t, err, flag.ErrHelp)
	checkContains(t, help.String(), "usage: tandem run [flags] -- CMD [ARGS...]")
	checkContains(t, help.String(), "-node-rank")
}

func TestRunWorkerEnvOverridesInherited(t *testing.T) {
	cfg := runConfig{nproc: 2, nnodes: 3, nodeRank: 2, masterAddr: "m", masterPort: 7, token: "t", restart: 1, maxRestarts: 4}
	env := cfg.workerEnv([]string{"PATH=/bin", "RANK=99", "MASTER_PORT=1", "A=b=c", "TANDEM_RESTART_COUNT=9"}, 1)
	checkEqual(t, []string{
		"PATH=/bin", "A=b=c",
		"RANK=5", "WORLD_SIZE=6", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=2", "GROUP_WORLD_SIZE=3",
		"MASTER_ADDR=m", "MASTER_PORT=7", "TANDEM_TOKEN=t", "TANDEM_RESTART_COUNT=1", "TANDEM_MAX_RESTARTS=4", "TANDEM_RUN_ID=", "TANDEM_STORE_PREFIX=",
	}, env)
	// What a worker reads back through package launch is what was meant.
	j, err := launch.From(launch.Lookup(env))
	if err != nil {
		t.Fatal(err)
	}
	checkEqual(t, launch.TandemRun, j.Launcher)
	checkEqual(t, [8]int{5, 6, 1, 2, 2, 3, 1, 4}, [8]int{j.Rank, j.WorldSize, j.LocalRank, j.LocalWorldSize, j.NodeRank, j.NumNodes, j.RestartCount, j.MaxRestarts})
	checkEqual(t, "m:7 t", j.MasterHostPort()+" "+j.Token)
}

// waitForFiles waits (at most 10 s) until every named file exists in dir.
func waitForFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range names {
		for {
			if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never appeared in %s", n, dir)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// The tests below run tandem as its own process: this test binary, re-run
// with TANDEM_RUN_HELPER=1, acts as the tandem command (see TestHelperTandem).

const helperEnv = "TANDEM_RUN_HELPER"

// TestHelperTandem is not a test: it is the tandem command when the test
// binary is re-run by tandemProcess.
func TestHelperTandem(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv+"_ARGS")), &args); err != nil {
		fmt.Fprintln(os.Stderr, "bad helper args:", err)
		os.Exit(99)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, args)
	stop()
	os.Exit(code)
}

// tandemProcess prepares `tandem ARGS...` as a child process.
func tandemProcess(t *testing.T, args ...string) (*exec.Cmd, *testlog.Buffer, *testlog.Buffer) {
	t.Helper()
	enc, err := json.Marshal(args)
	mustNoErr(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTandem$")
	// GORACE: a race-enabled binary otherwise sleeps 1 s before exiting 0.
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperEnv+"_ARGS="+string(enc), "GORACE=atexit_sleep_ms=0")
	var out, errOut testlog.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	return cmd, &out, &errOut
}

func TestRunAsCommandPrintsPrefixedLines(t *testing.T) {
	cmd, out, errOut := tandemProcess(t, "run", "-nproc", "3", "--", "sh", "-c", "echo $RANK/$WORLD_SIZE")
	mustNoErr(t, cmd.Run(), "stderr: %s", errOut)
	checkEqual(t, []string{"[0] 0/3", "[1] 1/3", "[2] 2/3"}, sortedLines(out.String()))
	checkEqual(t, "", errOut.String())
}

func TestRunAsCommandExitsWithWorkersCode(t *testing.T) {
	cmd, _, errOut := tandemProcess(t, "run", "-nproc", "3", "--", "sh", "-c",
		`if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30`)
	err := cmd.Run()
	var ee *exec.ExitError
	mustTrue(t, errors.As(err, &ee), "error %v is not an exec.ExitError", err)
	checkEqual(t, 3, ee.ExitCode())
	checkMatch(t, regexp.MustCompile(`(?m)^tandem run: rank 1 \(pid \d+\) exited with code 3; stopped the other \d workers?$`), errOut.String())
}

func TestRunAsCommandBadFlagExits2(t *testing.T) {
	cmd, _, errOut := tandemProcess(t, "run", "-nproc", "0", "--", "true")
	err := cmd.Run()
	var ee *exec.ExitError
	mustTrue(t, errors.As(err, &ee), "error %v is not an exec.ExitError", err)
	checkEqual(t, 2, ee.ExitCode())
	checkContains(t, errOut.String(), "tandem run: ")
	checkContains(t, errOut.String(), "-nproc 0: need at least 1 worker per node")
}

func TestRunAsCommandSIGINTStopsEverything(t *testing.T) {
	dir := t.TempDir()
	cmd, _, errOut := tandemProcess(t, "run", "-nproc", "3", "--", "sh", "-c", markerScript, "sh", dir)
	mustNoErr(t, cmd.Start())
	waitForFiles(t, dir, "0", "1", "2")
	mustNoErr(t, cmd.Process.Signal(os.Interrupt))
	err := cmd.Wait()
	var ee *exec.ExitError
	mustTrue(t, errors.As(err, &ee), "error %v is not an exec.ExitError; stderr: %s", err, errOut)
	checkEqual(t, 130, ee.ExitCode())
	checkContains(t, errOut.String(), "tandem run: received interrupt; stopped 3 workers")
	requireGone(t, markerPids(t, dir, 0, 1, 2))
}

// Example_run starts two workers that print their rank; each line comes out
// with the worker's rank in front.
func Example_run() {
	code := runMain(context.Background(), []string{"run", "-nproc", "2", "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE"})
	fmt.Println("exit status", code)
	// Unordered output:
	// [0] rank 0 of 2
	// [1] rank 1 of 2
	// exit status 0
}
