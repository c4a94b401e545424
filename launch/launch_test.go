package launch

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/testkit"
)

// pos is the part of a Job that tests compare: everything but Sources and
// the hints.
type pos struct {
	L                   Launcher
	Rank, World, LR, LW int
	NR, NN              int
	Addr                string
	Port                int
	Agent               bool
	Restart, MaxR       int
	RunID, Token        string
}

func posOf(j Job) pos {
	return pos{j.Launcher, j.Rank, j.WorldSize, j.LocalRank, j.LocalWorldSize, j.NodeRank, j.NumNodes,
		j.MasterAddr, j.MasterPort, j.AgentStore, j.RestartCount, j.MaxRestarts, j.RunID, j.Token}
}

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// readCapture reads testdata/DIR/rankN.env: NAME=VALUE lines, # comments.
func readCapture(t *testing.T, dir string, rank int) map[string]string {
	t.Helper()
	return testkit.ReadEnvFile(t, filepath.Join("testdata", dir, "rank"+strconv.Itoa(rank)+".env"))
}

// TestCapturedEnvironments reads environments recorded from the real
// launchers (see the first line of each testdata file for the command).
func TestCapturedEnvironments(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		ranks int
		add   map[string]string // variables the user passes on top
		want  func(r int) pos
	}{
		{"torchrun-1.13-single", 2, nil, func(r int) pos {
			return pos{Torchrun, r, 2, r, 2, 0, 1, "127.0.0.1", 29500, true, 0, 0, "none", ""}
		}},
		{"torchrun-1.13-standalone", 2, nil, func(r int) pos {
			return pos{Torchrun, r, 2, r, 2, 0, 1, "localhost", 48083, false, 0, 0, "22b558e6-7bdf-41fe-8aaa-4ece380bc953", ""}
		}},
		{"torchrun-1.13-two-nodes", 4, nil, func(r int) pos {
			return pos{Torchrun, r, 4, r % 2, 2, r / 2, 2, "127.0.0.1", 29611, true, 0, 0, "none", ""}
		}},
		{"openmpi-4.1.4-np3", 3, nil, func(r int) pos {
			return pos{OpenMPI, r, 3, r, 3, -1, -1, "127.0.0.1", DerivePort("OMPI_MCA_ess_base_jobid:789774337"), false, 0, -1, "789774337", ""}
		}},
		{"openmpi-4.1.4-np3", 3, map[string]string{"MASTER_PORT": "29400", "TANDEM_TOKEN": "s3cret"}, func(r int) pos {
			return pos{OpenMPI, r, 3, r, 3, -1, -1, "127.0.0.1", 29400, false, 0, -1, "789774337", "s3cret"}
		}},
		{"slurm-22.05-srun-n3", 3, nil, func(r int) pos {
			return pos{Slurm, r, 3, r, 3, 0, 1, "127.0.0.1", DerivePort("slurm:1.0"), false, 0, -1, "1.0", ""}
		}},
		{"slurm-22.05-srun-pmi2-n2", 2, nil, func(r int) pos {
			return pos{Slurm, r, 2, r, 2, 0, 1, "127.0.0.1", DerivePort("slurm:3.0"), false, 0, -1, "3.0", ""}
		}},
		{"mpich-4.0.2-hydra-n3", 3, map[string]string{"MASTER_PORT": "29500"}, func(r int) pos {
			return pos{PMI, r, 3, r, 3, -1, -1, "127.0.0.1", 29500, false, 0, -1, "", ""}
		}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			for r := range tc.ranks {
				env := readCapture(t, tc.dir, r)
				for k, v := range tc.add {
					env[k] = v
				}
				j, err := From(lookupMap(env))
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if got, want := posOf(j), tc.want(r); got != want {
					t.Errorf("rank %d:\n got %+v\nwant %+v", r, got, want)
				}
			}
		})
	}
}

// TestCapturedEnvironmentErrors: captured environments that cannot meet
// without help say which launcher, what is missing and what to do.
func TestCapturedEnvironmentErrors(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		says []string
	}{
		{"mpich-4.0.2-hydra-n3", []string{"detected an MPI process manager speaking PMI", "PMI_RANK=1 of 3", "no rendezvous port", "mpiexec -genv MASTER_PORT"}},
		{"slurm-22.05-batch", []string{"detected Slurm", "batch script", "SLURM_NTASKS=2", "srun PROGRAM"}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			rank := 0
			if tc.dir == "mpich-4.0.2-hydra-n3" {
				rank = 1
			}
			_, err := From(lookupMap(readCapture(t, tc.dir, rank)))
			checkErr(t, err, tc.says)
		})
	}
}

func checkErr(t *testing.T, err error, says []string) {
	t.Helper()
	if !errors.Is(err, errs.InvalidArgument) {
		t.Fatalf("want errs.InvalidArgument, got %v", err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// TestConstructedEnvironments covers launchers that cannot run here, with
// the variables their sources (cited in the package documentation) set.
func TestConstructedEnvironments(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want pos
	}{
		// training-operator v1.9, PyTorchJob "mnist" with 1 Master and 2
		// Workers, nprocPerNode defaulted to "auto", port 23456.
		{"PyTorchJob master", map[string]string{
			"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
			"MASTER_ADDR": "mnist-master-0", "PET_MASTER_ADDR": "mnist-master-0",
			"WORLD_SIZE": "3", "RANK": "0", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "3",
		}, pos{Kubeflow, 0, 3, 0, 1, 0, 3, "mnist-master-0", 23456, false, 0, -1, "", ""}},
		{"PyTorchJob worker", map[string]string{
			"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
			"MASTER_ADDR": "mnist-master-0", "PET_MASTER_ADDR": "mnist-master-0",
			"WORLD_SIZE": "3", "RANK": "2", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "3",
		}, pos{Kubeflow, 2, 3, 0, 1, 2, 3, "mnist-master-0", 23456, false, 0, -1, "", ""}},
		{"PyTorchJob worker nprocPerNode 1", map[string]string{
			"MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "j-master-0", "PET_MASTER_ADDR": "j-master-0",
			"WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "2",
		}, pos{Kubeflow, 1, 2, 0, 1, 1, 2, "j-master-0", 23456, false, 0, -1, "", ""}},
		// torchrun inside a PyTorchJob pod with nprocPerNode 2: torchrun's
		// variables win, the PET_* ones stay behind.
		{"torchrun in a PyTorchJob", map[string]string{
			"MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "j-master-0", "PET_MASTER_ADDR": "j-master-0",
			"WORLD_SIZE": "4", "RANK": "3", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2",
			"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
			"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
		}, pos{Torchrun, 3, 4, 1, 2, 1, 2, "j-master-0", 23456, true, 1, 3, "none", ""}},
		// Kubeflow Trainer TrainJob "tj", 3 nodes, numProcPerNode 1.
		{"TrainJob node", map[string]string{
			"PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2",
			"PET_MASTER_ADDR": "tj-node-0-0.tj", "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": "2",
		}, pos{Kubeflow, 2, 3, 0, 1, 2, 3, "tj-node-0-0.tj", 29500, false, 0, -1, "", ""}},
		// An indexed Job with 4 completions whose pod template sets the
		// rest, as the Launching section's manifest does.
		{"indexed Job", map[string]string{
			"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "train-3", "WORLD_SIZE": "4",
			"MASTER_ADDR": "train-0.train", "MASTER_PORT": "29500", "TANDEM_TOKEN": "k8s-secret",
		}, pos{IndexedJob, 3, 4, 0, 1, 3, -1, "train-0.train", 29500, false, 0, -1, "", "k8s-secret"}},
		// JobSet's own PyTorch example: RANK from the completion index
		// annotation through the downward API.
		{"JobSet with RANK from the annotation", map[string]string{
			"MASTER_ADDR": "pytorch-workers-0-0.pytorch", "MASTER_PORT": "3389", "RANK": "1", "WORLD_SIZE": "4",
			"JOB_COMPLETION_INDEX": "1", "PYTHONUNBUFFERED": "0",
		}, pos{IndexedJob, 1, 4, 0, 1, 1, -1, "pytorch-workers-0-0.pytorch", 3389, false, 0, -1, "", ""}},
		// srun -N3 --ntasks-per-node=2 on node[01-02,07] (Slurm 22.05
		// names), task 5 on the third node.
		{"srun over three nodes", map[string]string{
			"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "1", "SLURM_STEPID": "1",
			"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_NPROCS": "6", "SLURM_STEP_NUM_TASKS": "6",
			"SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_NNODES": "3", "SLURM_JOB_NUM_NODES": "3", "SLURM_STEP_NUM_NODES": "3",
			"SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_TASKS_PER_NODE": "2(x3)",
			"SLURM_JOB_NODELIST": "node[01-02,07]", "SLURM_NODELIST": "node[01-02,07]", "SLURM_STEP_NODELIST": "node[01-02,07]",
			"SLURMD_NODENAME": "node07", "SLURM_GTIDS": "4,5", "SLURM_TOPOLOGY_ADDR": "node07",
		}, pos{Slurm, 5, 6, 1, 2, 2, 3, "node01", DerivePort("slurm:4242.1"), false, 0, -1, "4242.1", ""}},
		// An uneven step: 3 tasks on the first node, 1 on the second, and a
		// requeued job.
		{"srun uneven, requeued", map[string]string{
			"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
			"SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
			"SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_STEP_NODELIST": "gpu-a,gpu-b[1-2]", "SLURM_RESTART_COUNT": "2",
		}, pos{Slurm, 3, 4, 0, 1, 1, 2, "gpu-a", DerivePort("slurm:77.0"), false, 2, -1, "77.0", ""}},
		// mpirun over two hosts with -x MASTER_ADDR: the port is derived.
		{"mpirun over two hosts", map[string]string{
			"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0", "OMPI_MCA_ess_base_jobid": "3141",
			"PMIX_NAMESPACE": "3141", "PMIX_RANK": "2", "MASTER_ADDR": "h0",
		}, pos{OpenMPI, 2, 4, 0, 2, -1, -1, "h0", DerivePort("OMPI_MCA_ess_base_jobid:3141"), false, 0, -1, "3141", ""}},
		// Open MPI 5 (PRRTE) has no OMPI_MCA_ess_base_jobid; its namespace
		// names the job.
		{"mpirun 5 single host", map[string]string{
			"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-h-1234@1", "PMIX_RANK": "1",
		}, pos{OpenMPI, 1, 2, 1, 2, -1, -1, "127.0.0.1", DerivePort("PMIX_NAMESPACE:prterun-h-1234@1"), false, 0, -1, "prterun-h-1234@1", ""}},
		// Cray PALS-style PMI with local variables and MASTER_ADDR/PORT.
		{"PMI with local size", map[string]string{
			"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4", "MASTER_ADDR": "nid0001", "MASTER_PORT": "29500",
		}, pos{PMI, 5, 8, 1, 4, -1, -1, "nid0001", 29500, false, 0, -1, "", ""}},
		{"RANK wins over Slurm", map[string]string{
			"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "5", "SLURM_STEP_ID": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1",
		}, pos{Manual, 0, 2, -1, -1, -1, -1, "h", 1, false, 0, -1, "", ""}},
		{"world of one", map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			pos{Manual, 0, 1, -1, -1, -1, -1, "", 0, false, 0, -1, "", ""}},
		// A step on part of the allocation: SLURM_TASKS_PER_NODE describes
		// the job's nodes, and does not reach this node's index; the
		// step's own list is missing. The local size is left unknown
		// rather than guessed.
		{"srun step beyond the job's tasks list", map[string]string{
			"SLURM_JOB_ID": "90", "SLURM_STEP_ID": "2", "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
			"SLURM_NODEID": "2", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NODELIST": "c[1-3]",
		}, pos{Slurm, 2, 3, 0, -1, 2, 3, "c1", DerivePort("slurm:90.2"), false, 0, -1, "90.2", ""}},
		{"batch script with one task", map[string]string{"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1"},
			pos{Slurm, 0, 1, -1, -1, -1, -1, "", 0, false, 0, -1, "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := From(lookupMap(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if got := posOf(j); got != tc.want {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestErrorsNameLauncherAndFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		says []string
	}{
		{"nothing", map[string]string{}, []string{"no launcher detected", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "tandem run"}},
		{"rank without world", map[string]string{"RANK": "1"}, []string{"RANK/WORLD_SIZE from the environment", "world size is not known", "set WORLD_SIZE", "tandem run"}},
		{"not a number", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, []string{`RANK="one"`, "non-negative integer"}},
		{"negative", map[string]string{"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, []string{"detected Open MPI", "OMPI_COMM_WORLD_RANK=\"-1\""}},
		{"rank out of range", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			[]string{"rank 2 (from RANK)", "world size 2 (from WORLD_SIZE)", "0 to 1"}},
		{"zero world", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, []string{"at least 1"}},
		{"local world larger than world", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", "MASTER_PORT": "1"},
			[]string{"local world size 3 (from LOCAL_WORLD_SIZE) exceeds the world size 2"}},
		{"local rank out of range", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			[]string{"local rank 2 (from LOCAL_RANK)", "local world size 2"}},
		{"node rank out of range", map[string]string{"RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			[]string{"node rank 2 (from GROUP_RANK)", "2 nodes"}},
		{"bad port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, []string{"MASTER_PORT=\"70000\"", "1..65535"}},
		{"no master addr", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, []string{"rank 0's host is not known", "MASTER_ADDR", "tandem run"}},
		{"no master port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, []string{"no rendezvous port", "MASTER_PORT", "tandem run"}},
		{"mpirun over hosts without MASTER_ADDR", map[string]string{
			"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": "5",
		}, []string{"detected Open MPI (OMPI_COMM_WORLD_RANK=1 of 3)", "rank 0's host", "mpirun -x MASTER_ADDR=HOST"}},
		{"mpirun without job id", map[string]string{
			"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
		}, []string{"detected Open MPI", "no rendezvous port", "mpirun -x MASTER_PORT=PORT"}},
		{"PMIx without size", map[string]string{"PMIX_RANK": "2", "PMIX_NAMESPACE": "ns"}, []string{"detected an MPI process manager speaking PMI", "PMIX_RANK gives no world size", "WORLD_SIZE"}},
		{"srun without node list", map[string]string{
			"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
		}, []string{"detected Slurm (SLURM_PROCID=1 of 2)", "no node list", "scontrol show hostnames"}},
		{"srun with a broken node list", map[string]string{
			"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "n[1-2",
		}, []string{"detected Slurm", "SLURM_STEP_NODELIST", "not closed", "MASTER_ADDR"}},
		{"srun with a broken tasks list", map[string]string{
			"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x",
		}, []string{"SLURM_STEP_TASKS_PER_NODE", "N(xM)"}},
		{"PyTorchJob with several processes per pod, started directly", map[string]string{
			"MASTER_ADDR": "j-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "8", "RANK": "1", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4", "PET_NNODES": "2",
		}, []string{"detected a Kubeflow PyTorchJob or TrainJob", "PET_NPROC_PER_NODE=4", "tandem run", "nprocPerNode"}},
		{"TrainJob with auto processes", map[string]string{
			"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "t-node-0-0.t", "PET_MASTER_PORT": "29500",
		}, []string{"detected a Kubeflow PyTorchJob or TrainJob", `PET_NPROC_PER_NODE="auto"`, "tandem run"}},
		{"PyTorchJob without a Master replica", map[string]string{
			"WORLD_SIZE": "2", "RANK": "1", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "1", "PET_NNODES": "2",
		}, []string{"detected a Kubeflow PyTorchJob or TrainJob", "Master replica"}},
		{"indexed Job without WORLD_SIZE", map[string]string{"JOB_COMPLETION_INDEX": "2"},
			[]string{"detected a Kubernetes indexed Job", "completions", "WORLD_SIZE"}},
		{"indexed Job without MASTER_ADDR", map[string]string{"JOB_COMPLETION_INDEX": "2", "WORLD_SIZE": "4", "MASTER_PORT": "29500", "HOSTNAME": "train-2"},
			[]string{"detected a Kubernetes indexed Job (JOB_COMPLETION_INDEX=2 of 4)", "MASTER_ADDR", "train-0", "JOBSET-REPLICATEDJOB-0-0.JOBSET"}},
		{"port alone, not a number", map[string]string{"MASTER_PORT": "http"}, []string{`launch: MASTER_PORT="http" is not a port number`}},
		{"agent store flag", map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "maybe", "RANK": "0", "WORLD_SIZE": "1"},
			[]string{"detected torchrun", "TORCHELASTIC_USE_AGENT_STORE=\"maybe\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := From(lookupMap(tc.env))
			checkErr(t, err, tc.says)
		})
	}
}

// TestReadIsPartial: Read accepts a job with pieces missing, for callers
// (comm.Init's options, tandem run's flags) that fill them in before Resolve.
func TestReadIsPartial(t *testing.T) {
	j, err := Read(lookupMap(map[string]string{"MASTER_ADDR": "h", "MASTER_PORT": "7"}))
	if err != nil {
		t.Fatal(err)
	}
	if j.Launcher != Unknown || j.Rank != -1 || j.WorldSize != -1 || j.MasterHostPort() != "h:7" {
		t.Fatalf("got %+v", j)
	}
	j.Rank, j.Sources.Rank = 1, "a flag"
	j.WorldSize, j.Sources.WorldSize = 1, "a flag"
	err = j.Resolve(true)
	checkErr(t, err, []string{"rank 1 (from a flag)", "world size 1 (from a flag)"})
	j.WorldSize = 2
	if err := j.Resolve(true); err != nil {
		t.Fatal(err)
	}
	// Without the rendezvous check, an address is not required.
	k := Job{Launcher: Manual, Rank: 0, WorldSize: 3, LocalRank: -1, LocalWorldSize: -1, NodeRank: -1, NumNodes: -1}
	if err := k.Resolve(false); err != nil {
		t.Fatal(err)
	}
	if err := k.Resolve(true); err == nil {
		t.Fatal("a world of 3 with no address resolved")
	}
}

func TestEnvironRoundTrip(t *testing.T) {
	for _, j := range []Job{
		{Launcher: TandemRun, Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, NodeRank: 1, NumNodes: 2,
			MasterAddr: "node0", MasterPort: 29500, RestartCount: 2, MaxRestarts: 3, RunID: "r1", Token: "tok"},
		{Launcher: TandemRun, Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, NodeRank: 1, NumNodes: 2,
			MasterAddr: "10.0.0.1", MasterPort: 29400, RestartCount: 1, MaxRestarts: 5, RunID: "job7", Token: "tok", StorePrefix: "job7/round/1"},
		{Launcher: TandemRun, Rank: 0, WorldSize: 1, LocalRank: -1, LocalWorldSize: -1, NodeRank: -1, NumNodes: -1, MaxRestarts: -1},
		{Launcher: TandemRun, Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NodeRank: 0, NumNodes: 1,
			MasterAddr: "::1", MasterPort: 1, MaxRestarts: 0},
	} {
		env := j.Environ()
		// Over an environment that another launcher set, Overlay leaves
		// nothing of it that Read would prefer.
		base := []string{"PATH=/bin", "RANK=9", "LOCAL_RANK=7", "TANDEM_TOKEN=old", "MASTER_PORT=1234", "GROUP_WORLD_SIZE=9"}
		got, err := Read(Lookup(Overlay(base, env)))
		if err != nil {
			t.Fatal(err)
		}
		if posOf(got) != posOf(j) {
			t.Fatalf("Environ %q read back as\n %+v\nwant %+v", env, posOf(got), posOf(j))
		}
		if got.StorePrefix != j.StorePrefix {
			t.Fatalf("Environ %q read back with store prefix %q, want %q", env, got.StorePrefix, j.StorePrefix)
		}
		if err := got.Resolve(true); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOverlay(t *testing.T) {
	base := []string{"A=1", "B=2", "C=3"}
	got := Overlay(base, []string{"B=x", "D=4"})
	want := []string{"A=1", "C=3", "B=x", "D=4"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q, want %q", got, want)
	}
	if strings.Join(base, " ") != "A=1 B=2 C=3" {
		t.Fatalf("base modified: %q", base)
	}
	v, ok := Lookup([]string{"A=1", "A=2", "E="})("A")
	if !ok || v != "2" {
		t.Fatalf("Lookup A = %q %v, want the later entry", v, ok)
	}
	if v, ok := Lookup([]string{"E="})("E"); !ok || v != "" {
		t.Fatalf("Lookup E = %q %v", v, ok)
	}
}

func TestDerivePort(t *testing.T) {
	seen := map[int]bool{}
	for _, id := range []string{"slurm:1.0", "slurm:2.0", "slurm:1.1", "OMPI_MCA_ess_base_jobid:789774337", ""} {
		p := DerivePort(id)
		if p < DerivedPortBase || p >= DerivedPortBase+DerivedPortSpan {
			t.Fatalf("DerivePort(%q) = %d, outside [%d, %d)", id, p, DerivedPortBase, DerivedPortBase+DerivedPortSpan)
		}
		if p != DerivePort(id) {
			t.Fatalf("DerivePort(%q) is not stable", id)
		}
		seen[p] = true
	}
	if len(seen) < 4 {
		t.Fatalf("five ids gave only %d ports", len(seen))
	}
}

func TestTasksOnNode(t *testing.T) {
	for _, tc := range []struct {
		list string
		node int
		want int
	}{{"4", 0, 4}, {"2(x3),1", 0, 2}, {"2(x3),1", 2, 2}, {"2(x3),1", 3, 1}, {"1,3(x2)", 2, 3}} {
		got, err := tasksOnNode(tc.list, tc.node)
		if err != nil || got != tc.want {
			t.Errorf("tasksOnNode(%q, %d) = %d, %v; want %d", tc.list, tc.node, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		list string
		node int
	}{{"2(x3)", 3}, {"x", 0}, {"2(x0)", 0}, {"2(x3", 0}, {"", 0}} {
		if n, err := tasksOnNode(tc.list, tc.node); err == nil {
			t.Errorf("tasksOnNode(%q, %d) = %d, want an error", tc.list, tc.node, n)
		}
	}
}

func TestLauncherString(t *testing.T) {
	for l := Unknown; l <= Slurm; l++ {
		if s := l.String(); s == "" || strings.HasPrefix(s, "launcher(") {
			t.Errorf("Launcher %d has no name", int(l))
		}
	}
	if s := Launcher(99).String(); s != "launcher(99)" {
		t.Errorf("Launcher(99) = %q", s)
	}
}
