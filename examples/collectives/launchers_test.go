package main

// The tutorial under the launchers people already use: real mpirun and
// torchrun processes where they are installed (.ci/run installs Debian's
// openmpi-bin and python3-torch), and the environments that Slurm, Kubeflow
// and Kubernetes set, recorded or written as those systems write them, given
// to processes started here. Each test builds the program once and checks
// every rank's output and exit status; TestLaunchErrors checks that a job
// missing a variable fails at once with a message naming the launcher and
// the fix.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/launch"
)

// buildDir holds the programs built once for every launcher test: the
// tutorial, and tandem (for `tandem run` in a pod).
var buildDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// program builds examples/collectives and cmd/tandem into a temporary
// folder the first time a test asks for them and returns the tutorial's
// path; tandem lies beside it.
func program(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go command is not on PATH: %w", err)
			return
		}
		if buildDir, err = os.MkdirTemp("", "tandem-collectives-"); err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(buildDir, "collectives")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		args := []string{"build", "-o", buildDir + string(filepath.Separator)}
		if raceBuild {
			args = append(args, "-race")
		}
		out, err := exec.CommandContext(ctx, goBin, append(args, ".", "../../cmd/tandem")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// need returns the path of the first of names found on PATH. A launcher
// that is missing fails the test under CI (CI=true, which .ci/run sets,
// after installing it), so that a failed install cannot hide these tests;
// elsewhere the test is skipped with what to install.
func need(t *testing.T, pkg string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	missing(t, fmt.Sprintf("%s not found on PATH: install Debian's %s (apt-get install %s)", strings.Join(names, " or "), pkg, pkg))
	return ""
}

// missing ends a test whose launcher is not here: a failure under CI, a
// skip with msg elsewhere.
func missing(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI installs it in .ci/run, so its install failed")
	}
	t.Skip(msg)
}

// baseEnv is the environment every process starts from: enough to run
// programs, and no variable of any launcher, so that what a test adds is
// all the job knows.
func baseEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"}
	if raceBuild {
		// A program built with -race waits a second at exit for late race
		// reports; a tenth is plenty for these, and saves seconds a test.
		env = append(env, "GORACE=atexit_sleep_ms=100 exitcode=66")
	}
	for _, k := range []string{"HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// portIsFree reports whether port can be bound on 127.0.0.1 now.
func portIsFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// slurmJobID returns a Slurm job id whose derived rendezvous port (step 0)
// is free here, so that runs of this test beside each other, or beside
// another job, do not meet on one port.
func slurmJobID(t *testing.T) string {
	t.Helper()
	base := os.Getpid()*7919 + int(time.Now().UnixNano()%100000)
	for i := range 200 {
		id := strconv.Itoa(100000 + (base+i)%900000)
		if portIsFree(launch.DerivePort("slurm:" + id + ".0")) {
			return id
		}
	}
	t.Fatal("no Slurm job id with a free derived port in 200 tries")
	return ""
}

// capture reads launch/testdata/DIR/rankN.env: NAME=VALUE lines recorded
// under a real launcher, # comments.
func capture(t *testing.T, dir string, rank int) map[string]string {
	t.Helper()
	return testkit.ReadEnvFile(t, filepath.Join("..", "..", "launch", "testdata", dir, "rank"+strconv.Itoa(rank)+".env"))
}

// result is what one process of a job left behind.
type result struct {
	stdout, stderr string
	err            error
}

// runProcs starts one process of the program per environment, each with
// baseEnv plus its variables, and waits for all of them.
func runProcs(t *testing.T, envs []map[string]string) []result {
	t.Helper()
	bin := program(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := make([]result, len(envs))
	var wg sync.WaitGroup
	for i, vars := range envs {
		cmd := exec.CommandContext(ctx, bin, "-timeout", "30s")
		cmd.Env = baseEnv()
		for k, v := range vars {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			res[i] = result{out.String(), errb.String(), err}
		}()
	}
	wg.Wait()
	return res
}

// checkRank checks one rank's output: every collective's result for a job
// of n ranks, in order, and the mismatch caught on every rank.
func checkRank(t *testing.T, rank, n int, out string) {
	t.Helper()
	sum := n * (n + 1) / 2
	gathered := make([]string, n)
	for i := range gathered {
		gathered[i] = strconv.Itoa(i * i)
	}
	want := []string{
		fmt.Sprintf("rank %d of %d joined", rank, n),
		fmt.Sprintf("all_reduce(sum)  -> [%d %d]", sum, 10*sum),
		"broadcast(0)     -> [3 1 4]",
		"all_gather       -> [" + strings.Join(gathered, " ") + "]",
		"all_reduce(max)  -> [1]",
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != len(want)+1 {
		t.Errorf("rank %d printed %d lines, want %d:\n%s", rank, len(lines), len(want)+1, out)
		return
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("rank %d line %d: got %q, want %q", rank, i+1, lines[i], w)
		}
	}
	last := lines[len(want)]
	if !strings.HasPrefix(last, "mismatch caught  -> ") || !strings.Contains(last, fmt.Sprintf("this is rank %d)", rank)) {
		t.Errorf("rank %d last line: got %q, want the mismatch caught on rank %d", rank, last, rank)
	}
}

// checkJob checks that every process exited 0 and printed its rank's
// results; ranks[i] is the rank process i was given.
func checkJob(t *testing.T, res []result, ranks []int) {
	t.Helper()
	for i, r := range res {
		if r.err != nil {
			t.Errorf("process %d (rank %d): %v\nstderr:\n%s\nstdout:\n%s", i, ranks[i], r.err, r.stderr, r.stdout)
			continue
		}
		checkRank(t, ranks[i], len(res), r.stdout)
	}
}

// splitTagged splits a launcher's merged output into each rank's lines,
// using the tag the launcher puts before each line of a rank: the regexp's
// first group is the rank, and the line follows the match.
func splitTagged(t *testing.T, out string, tag *regexp.Regexp) map[int]string {
	t.Helper()
	per := map[int]string{}
	for _, line := range strings.Split(out, "\n") {
		m := tag.FindStringSubmatchIndex(line)
		if m == nil {
			continue
		}
		r, err := strconv.Atoi(line[m[2]:m[3]])
		if err != nil {
			t.Fatalf("tag of %q: %v", line, err)
		}
		per[r] += line[m[1]:] + "\n"
	}
	return per
}

// openMPIVersion matches what Open MPI's mpirun --version prints: "mpirun
// (Open MPI) 4.1.4", or "mpirun.openmpi (OpenRTE) 4.1.4" under Debian's name.
var openMPIVersion = regexp.MustCompile(`\((Open MPI|OpenRTE)\) \d`)

// TestMpirun runs the program under Open MPI's `mpirun -np 3` with no
// variable set by hand: the ranks come from OMPI_COMM_WORLD_*, rank 0's
// host is 127.0.0.1 (all three are local) and the port is derived from
// Open MPI's job id.
func TestMpirun(t *testing.T) {
	mpirun := need(t, "openmpi-bin", "mpirun.openmpi", "mpirun")
	if v, err := exec.Command(mpirun, "--version").CombinedOutput(); err != nil || !openMPIVersion.Match(v) {
		// Debian's mpirun is MPICH's when only mpich is installed; Open
		// MPI's is always also mpirun.openmpi.
		missing(t, fmt.Sprintf("%s is not Open MPI's mpirun (%v: %.80q): install Debian's openmpi-bin", mpirun, err, v))
	}
	bin := program(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// --oversubscribe: three ranks on a machine that may have two cores.
	// --tag-output: each line as [JOBID,RANK]<stdout>:LINE.
	cmd := exec.CommandContext(ctx, mpirun, "--oversubscribe", "--tag-output", "-np", "3", bin, "-timeout", "30s")
	// Open MPI refuses to run as root (as CI does) unless told both.
	cmd.Env = append(baseEnv(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("mpirun: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	per := splitTagged(t, stdout.String(), regexp.MustCompile(`^\[\d+,(\d+)\]<stdout>:`))
	if len(per) != 3 {
		t.Fatalf("output from %d ranks, want 3:\n%s", len(per), stdout.String())
	}
	for r := range 3 {
		checkRank(t, r, 3, per[r])
	}
}

// TestTorchrun runs the program under torchrun with its c10d rendezvous,
// started the ways users start it: --standalone (one machine, torchrun
// picks the port), --rdzv_backend c10d with an endpoint, and two torchrun
// agents meeting at one endpoint as two nodes would (one process each, both
// on this machine). torchrun then sets TORCHELASTIC_USE_AGENT_STORE=False,
// MASTER_ADDR (the first agent's host name) and a free MASTER_PORT, where
// rank 0 serves Tandem's store; the local and group sizes say whether the
// ranks span several nodes.
//
// --monitor_interval 0.5 has the agent look at its workers every half
// second instead of every five, so that a run takes two seconds, not six.
//
// `-r 1 -t 1` (redirect each rank's stdout to a log and tee it back, tagged
// [default0]:) is needed by Debian's torch 1.13 on Python 3.11, and is
// harmless elsewhere: without it torchrun fails before starting a worker
// with "AttributeError: 'NoneType' object has no attribute 'get'", because
// Std.from_str("0") looks for a member equal to 0 by iterating the IntFlag
// Std, and Python 3.11 no longer yields the zero member NONE.
//
// torchrun's default, static rendezvous (no --standalone, no
// --rdzv_backend), where the ranks join the agent's PyTorch TCPStore, is
// TestTorchrunAgentStore's.
func TestTorchrun(t *testing.T) {
	torchrun := need(t, "python3-torch", "torchrun")
	bin := program(t)
	endpoint := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	for _, tc := range []struct {
		name   string
		agents [][]string // each agent's rendezvous arguments
		nproc  int        // processes per agent
	}{
		{"standalone", [][]string{{"--standalone"}}, 2},
		{"c10d", [][]string{{"--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint(), "--nnodes", "1"}}, 2},
		{"c10d two agents", func() [][]string {
			a := []string{"--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint(), "--nnodes", "2"}
			return [][]string{a, a}
		}(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			world := len(tc.agents) * tc.nproc
			type agent struct {
				args           []string
				stdout, stderr bytes.Buffer
				err            error
			}
			agents := make([]*agent, len(tc.agents))
			var wg sync.WaitGroup
			for i, rdzv := range tc.agents {
				a := &agent{args: append(append([]string{}, rdzv...),
					"--nproc_per_node", strconv.Itoa(tc.nproc), "--monitor_interval", "0.5", "-r", "1", "-t", "1", "--no_python", bin, "-timeout", "30s")}
				agents[i] = a
				cmd := exec.CommandContext(ctx, torchrun, a.args...)
				cmd.Env = baseEnv()
				cmd.Stdout, cmd.Stderr = &a.stdout, &a.stderr
				wg.Add(1)
				go func() {
					defer wg.Done()
					a.err = cmd.Run()
				}()
			}
			wg.Wait()
			seen := map[int]bool{}
			tag := regexp.MustCompile(`^\[default(\d+)\]:`)
			joined := regexp.MustCompile(`^rank (\d+) of \d+ joined\n`)
			for i, a := range agents {
				if a.err != nil {
					t.Fatalf("agent %d, torchrun %s: %v\nstderr:\n%s\nstdout:\n%s", i, strings.Join(a.args, " "), a.err, a.stderr.String(), a.stdout.String())
				}
				per := splitTagged(t, a.stdout.String(), tag)
				if len(per) != tc.nproc {
					t.Fatalf("agent %d: output from %d local ranks, want %d:\nstdout:\n%s\nstderr:\n%s", i, len(per), tc.nproc, a.stdout.String(), a.stderr.String())
				}
				for lr, out := range per {
					m := joined.FindStringSubmatch(out)
					if m == nil {
						t.Errorf("agent %d local rank %d did not say which rank joined:\n%s", i, lr, out)
						continue
					}
					r, _ := strconv.Atoi(m[1])
					if seen[r] {
						t.Errorf("rank %d ran twice", r)
					}
					seen[r] = true
					checkRank(t, r, world, out)
				}
			}
			if len(seen) != world {
				t.Errorf("ranks %v ran, want 0 to %d", seen, world-1)
			}
		})
	}
}

// TestSlurmSrun gives three processes the environment that `srun -n3`
// set on a one-node Slurm 22.05 cluster (launch/testdata), with only the
// job id changed so that the derived port is free: no MASTER_ADDR or
// MASTER_PORT, ranks from SLURM_PROCID, rank 0's host 127.0.0.1 since the
// step has one node, the port derived from the job and step ids.
func TestSlurmSrun(t *testing.T) {
	id := slurmJobID(t)
	envs := make([]map[string]string, 3)
	for r := range envs {
		envs[r] = capture(t, "slurm-22.05-srun-n3", r)
		envs[r]["SLURM_JOB_ID"], envs[r]["SLURM_JOBID"] = id, id
	}
	checkJob(t, runProcs(t, envs), []int{0, 1, 2})
}

// TestSlurmTwoNodes gives four processes what srun -N2 -n4 sets in a job
// allocated three nodes, "localhost" and node[02-03]: two tasks per node,
// and rank 0's host is the first of the step's node list (here localhost,
// so that the four processes, all on this machine, meet).
func TestSlurmTwoNodes(t *testing.T) {
	id := slurmJobID(t)
	var envs []map[string]string
	for rank := range 4 {
		envs = append(envs, map[string]string{
			"SLURM_JOB_ID": id, "SLURM_JOBID": id, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
			"SLURM_JOB_NODELIST": "localhost,node[02-03]", "SLURM_NODELIST": "localhost,node[02-03]",
			"SLURM_JOB_NUM_NODES": "3", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "2(x3)",
			"SLURM_STEP_NODELIST": "localhost,node02", "SLURM_STEP_NUM_NODES": "2",
			"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
			"SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
			"SLURM_PROCID": strconv.Itoa(rank), "SLURM_LOCALID": strconv.Itoa(rank % 2), "SLURM_NODEID": strconv.Itoa(rank / 2),
		})
	}
	checkJob(t, runProcs(t, envs), []int{0, 1, 2, 3})
}

// TestKubeflowPyTorchJob gives three processes what Kubeflow's training
// operator (v1.9) sets in the pods of a PyTorchJob "demo" with one Master
// and two Worker replicas and nprocPerNode "1": RANK is the pod's index
// (the Master 0, Worker i i+1), WORLD_SIZE 3, PET_* beside them. The
// operator's MASTER_ADDR is the Master's Service, demo-master-0, which
// resolves only in the cluster: here it is 127.0.0.1, and MASTER_PORT (the
// container's pytorchjob-port, 23456 by default) is a free port.
func TestKubeflowPyTorchJob(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	var envs []map[string]string
	for rank := range 3 {
		host := "demo-master-0"
		if rank > 0 {
			host = "demo-worker-" + strconv.Itoa(rank-1)
		}
		envs = append(envs, map[string]string{
			"HOSTNAME": host, "PYTHONUNBUFFERED": "1",
			"MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
			"MASTER_PORT": port, "PET_MASTER_PORT": port,
			"WORLD_SIZE": "3", "RANK": strconv.Itoa(rank),
			"PET_NNODES": "3", "PET_NODE_RANK": strconv.Itoa(rank), "PET_NPROC_PER_NODE": "1",
		})
	}
	checkJob(t, runProcs(t, envs), []int{0, 1, 2})
}

// podTandemRun is the container command of a PyTorchJob with
// nprocPerNode above 1 (examples/kubernetes/README.md): `tandem run` starts
// the pod's processes, told the pod's place by the operator's variables.
const podTandemRun = `exec tandem run -nproc "$PET_NPROC_PER_NODE" -nnodes "$PET_NNODES" -node-rank "$PET_NODE_RANK" -master "$MASTER_ADDR:$MASTER_PORT" -- collectives`

// TestKubeflowPyTorchJobTandemRun runs two pods of a PyTorchJob with one
// Master, one Worker and nprocPerNode "2", each pod running podTandemRun
// with the variables the operator sets (WORLD_SIZE 4, RANK the pod's index)
// and TANDEM_TOKEN from the job's Secret, which `tandem run` needs over
// several nodes: four ranks, two a pod.
func TestKubeflowPyTorchJobTandemRun(t *testing.T) {
	bin := program(t)
	port := strconv.Itoa(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type pod struct {
		stdout, stderr bytes.Buffer
		err            error
	}
	pods := make([]*pod, 2)
	var wg sync.WaitGroup
	for i := range pods {
		p := &pod{}
		pods[i] = p
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", podTandemRun+" -timeout 30s")
		cmd.Env = append(baseEnv(), "PATH="+filepath.Dir(bin)+string(filepath.ListSeparator)+os.Getenv("PATH"),
			"TANDEM_TOKEN=pytorchjob-secret", "PYTHONUNBUFFERED=1",
			"MASTER_ADDR=127.0.0.1", "PET_MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "PET_MASTER_PORT="+port,
			"WORLD_SIZE=4", "RANK="+strconv.Itoa(i), "PET_NNODES=2", "PET_NODE_RANK="+strconv.Itoa(i), "PET_NPROC_PER_NODE=2")
		cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = cmd.Run()
		}()
	}
	wg.Wait()
	tag := regexp.MustCompile(`^\[(\d+)\] `)
	for i, p := range pods {
		if p.err != nil {
			t.Fatalf("pod %d: %v\nstderr:\n%s\nstdout:\n%s", i, p.err, p.stderr.String(), p.stdout.String())
		}
		per := splitTagged(t, p.stdout.String(), tag)
		if len(per) != 2 {
			t.Fatalf("pod %d: output from %d ranks, want 2:\n%s", i, len(per), p.stdout.String())
		}
		for _, r := range []int{2 * i, 2*i + 1} {
			checkRank(t, r, 4, per[r])
		}
	}
}

// TestKubeflowTrainJob gives three processes what Kubeflow Trainer sets in
// the pods of a TrainJob "demo" with numNodes 3 and numProcPerNode 1: only
// PET_* and the indexed Job's JOB_COMPLETION_INDEX, no RANK or WORLD_SIZE.
// PET_MASTER_ADDR, demo-node-0-0.demo in the cluster, is 127.0.0.1 here.
func TestKubeflowTrainJob(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	var envs []map[string]string
	for rank := range 3 {
		envs = append(envs, map[string]string{
			"HOSTNAME":      "demo-node-0-" + strconv.Itoa(rank),
			"PET_NNODES":    "3",
			"PET_NODE_RANK": strconv.Itoa(rank), "JOB_COMPLETION_INDEX": strconv.Itoa(rank),
			"PET_NPROC_PER_NODE": "1",
			"PET_MASTER_ADDR":    "127.0.0.1", "PET_MASTER_PORT": port,
		})
	}
	checkJob(t, runProcs(t, envs), []int{0, 1, 2})
}

// TestIndexedJob gives three processes what a Kubernetes indexed Job with
// completions 3 sets (JOB_COMPLETION_INDEX, HOSTNAME demo-INDEX) and what
// examples/kubernetes/indexed-job.yaml's pod template adds: WORLD_SIZE,
// MASTER_ADDR (demo-0.demo there, through the headless Service; 127.0.0.1
// here) and MASTER_PORT.
func TestIndexedJob(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	var envs []map[string]string
	for rank := range 3 {
		envs = append(envs, map[string]string{
			"HOSTNAME": "demo-" + strconv.Itoa(rank), "JOB_COMPLETION_INDEX": strconv.Itoa(rank),
			"WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
		})
	}
	checkJob(t, runProcs(t, envs), []int{0, 1, 2})
}

// TestLaunchErrors starts one process of a job whose launcher left out
// something the job needs, and checks that it exits 1 at once, before any
// network wait, with one message naming the launcher detected and the fix.
func TestLaunchErrors(t *testing.T) {
	ompi := capture(t, "openmpi-4.1.4-np3", 1)
	ompiTwoHosts := map[string]string{}
	for k, v := range ompi {
		ompiTwoHosts[k] = v
	}
	ompiTwoHosts["OMPI_COMM_WORLD_SIZE"], ompiTwoHosts["OMPI_COMM_WORLD_LOCAL_SIZE"] = "6", "3"
	ompiNoJobID := map[string]string{
		"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
	}
	slurmBatch := capture(t, "slurm-22.05-batch", 0)
	slurmBatch["SLURM_NTASKS"], slurmBatch["SLURM_NPROCS"] = "3", "3"
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"nothing set", map[string]string{},
			[]string{"no launcher detected", "tandem run -nproc N", "MASTER_PORT"}},
		{"Open MPI over two hosts", ompiTwoHosts,
			[]string{"detected Open MPI (OMPI_COMM_WORLD_RANK=1 of 6)", "rank 0's host is not known", "mpirun -x MASTER_ADDR=HOST"}},
		{"Open MPI without a job id", ompiNoJobID,
			[]string{"detected Open MPI", "no rendezvous port", "mpirun -x MASTER_PORT=PORT"}},
		{"MPICH Hydra", capture(t, "mpich-4.0.2-hydra-n3", 1),
			[]string{"detected an MPI process manager speaking PMI (PMI_RANK=1 of 3)", "mpiexec -genv MASTER_PORT PORT"}},
		{"Slurm batch script of three tasks", slurmBatch,
			[]string{"detected Slurm", "batch script", "srun PROGRAM"}},
		{"Slurm over two nodes without a node list", map[string]string{
			"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4",
			"SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
		}, []string{"detected Slurm (SLURM_PROCID=1 of 4)", "no node list", "MASTER_ADDR"}},
		{"PyTorchJob without a Master replica", map[string]string{
			"WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "2",
		}, []string{"detected a Kubeflow PyTorchJob or TrainJob", "Master replica"}},
		{"PyTorchJob with two processes per pod, started directly", map[string]string{
			"MASTER_ADDR": "demo-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "1",
			"PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2",
		}, []string{"detected a Kubeflow PyTorchJob or TrainJob", "PET_NPROC_PER_NODE=2", "tandem run"}},
		{"indexed Job without WORLD_SIZE", map[string]string{
			"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "demo-1", "MASTER_ADDR": "demo-0.demo", "MASTER_PORT": "29500",
		}, []string{"detected a Kubernetes indexed Job", "set WORLD_SIZE in the pod template"}},
		{"indexed Job without MASTER_ADDR", map[string]string{
			"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "demo-1", "WORLD_SIZE": "3", "MASTER_PORT": "29500",
		}, []string{"detected a Kubernetes indexed Job (JOB_COMPLETION_INDEX=1 of 3)", "set MASTER_ADDR in the pod template", "index 0's is demo-0"}},
		{"rank beyond the world", map[string]string{
			"RANK": "3", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
		}, []string{"RANK/WORLD_SIZE from the environment", "rank 3 (from RANK) is out of range for world size 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := runProcs(t, []map[string]string{tc.env})[0]
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("the error took %v: it must come before any wait", took)
			}
			var exit *exec.ExitError
			if !errors.As(r.err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1\nstdout:\n%s\nstderr:\n%s", r.err, r.stdout, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			msg := strings.TrimSpace(r.stderr)
			if strings.Count(msg, "\n") != 0 || !strings.HasPrefix(msg, "collectives: ") {
				t.Errorf("stderr is not one line starting with the program's name:\n%s", r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
		})
	}
}
