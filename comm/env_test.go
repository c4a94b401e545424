package comm

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/tandemml/tandem/launch"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestEnvFromVariables(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
		want Env
	}{
		{"tandem run",
			map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TANDEM_RESTART_COUNT": "0"},
			Env{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "node0", MasterPort: 29500, Source: "RANK/WORLD_SIZE", Launcher: launch.TandemRun}},
		{"torchrun",
			map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
				"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "RANK/WORLD_SIZE", Launcher: launch.Torchrun}},
		{"single machine defaults MASTER_ADDR",
			map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1234"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1234, Source: "RANK/WORLD_SIZE", Launcher: launch.Manual}},
		{"mpirun (Open MPI) over hosts",
			map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "5000"},
			Env{Rank: 2, WorldSize: 4, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "10.0.0.1", MasterPort: 5000, Source: "OMPI_COMM_WORLD_*", Launcher: launch.OpenMPI}},
		{"mpirun on one host needs no variable",
			map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "OMPI_MCA_ess_base_jobid": "789774337", "PMIX_NAMESPACE": "789774337"},
			Env{Rank: 1, WorldSize: 3, LocalRank: 1, LocalWorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: launch.DerivePort("OMPI_MCA_ess_base_jobid:789774337"), Source: "OMPI_COMM_WORLD_*", Launcher: launch.OpenMPI}},
		{"srun on one node",
			map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1", "SLURM_NNODES": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "12", "MASTER_PORT": "7000"},
			Env{Rank: 1, WorldSize: 3, LocalRank: 1, LocalWorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: 7000, Source: "SLURM_*", Launcher: launch.Slurm}},
		{"srun over nodes finds rank 0's host and a port",
			map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "12",
				"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "cn[07-08]"},
			Env{Rank: 3, WorldSize: 4, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "cn07", MasterPort: launch.DerivePort("slurm:12.0"), Source: "SLURM_*", Launcher: launch.Slurm}},
		{"RANK wins over fallbacks",
			map[string]string{"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "5", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			Env{Rank: 0, WorldSize: 2, LocalRank: -1, LocalWorldSize: -1, MasterAddr: "h", MasterPort: 1, Source: "RANK/WORLD_SIZE", Launcher: launch.Manual}},
		{"world of one needs no master",
			map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			Env{Rank: 0, WorldSize: 1, LocalRank: -1, LocalWorldSize: -1, Source: "RANK/WORLD_SIZE", Launcher: launch.Manual}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envFrom(lookupMap(tc.vars))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestEnvErrorsSayWhatToSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
		says []string
	}{
		{"nothing set", map[string]string{}, []string{"no launcher detected", "WORLD_SIZE", "tandem run", "comm.WithWorldSize"}},
		{"no rank", map[string]string{"WORLD_SIZE": "2"}, []string{"RANK", "tandem run", "comm.WithRank"}},
		{"rank out of range", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, []string{"rank 2", "RANK", "world size 2", "0 to 1"}},
		{"bad integer", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, []string{`RANK="one"`}},
		{"zero world", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, []string{"at least 1"}},
		{"no master addr across machines", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, []string{"MASTER_ADDR", "rank 0"}},
		{"no master port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, []string{"MASTER_PORT", "tandem run"}},
		{"bad port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, []string{"MASTER_PORT", "70000"}},
		{"local rank out of range", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1"}, []string{"local rank 2 (from LOCAL_RANK)"}},
		{"mpirun over hosts names the launcher and the fix", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": "9"},
			[]string{"detected Open MPI (OMPI_COMM_WORLD_RANK=1 of 3)", "mpirun -x MASTER_ADDR="}},
		{"srun batch script", map[string]string{"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, []string{"detected Slurm", "srun PROGRAM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := envFrom(lookupMap(tc.vars))
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("want ErrInvalidArgument, got %v", err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestEnvAgreesWithLaunch: comm reads the environment through package
// launch, so the two never disagree, here on environments Job.Environ wrote.
func TestEnvAgreesWithLaunch(t *testing.T) {
	for _, j := range []launch.Job{
		{Rank: 2, WorldSize: 4, LocalRank: 0, LocalWorldSize: 2, NodeRank: 1, NumNodes: 2, MasterAddr: "n0", MasterPort: 29500, MaxRestarts: -1},
		{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NodeRank: 0, NumNodes: 1, MasterPort: 4000, MaxRestarts: 3, Token: "t"},
	} {
		lookup := launch.Lookup(j.Environ())
		want, err := launch.From(lookup)
		if err != nil {
			t.Fatal(err)
		}
		got, err := envFrom(lookup)
		if err != nil {
			t.Fatal(err)
		}
		if got.Rank != want.Rank || got.WorldSize != want.WorldSize || got.LocalRank != want.LocalRank ||
			got.LocalWorldSize != want.LocalWorldSize || got.MasterHostPort() != want.MasterHostPort() || got.Launcher != launch.TandemRun {
			t.Fatalf("comm read %+v, launch read %+v", got, want)
		}
	}
}

// launchVars are the variables package launch reads, cleared so that
// TestEnvFromOS sees only what it sets even when the tests themselves run
// under a launcher.
var launchVars = []string{
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
	launch.TokenEnv, launch.RestartCountEnv, launch.MaxRestartsEnv, launch.RunIDEnv, launch.StorePrefixEnv,
	"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
	"PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT", "JOB_COMPLETION_INDEX",
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid",
	"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "PMIX_NAMESPACE", "PMI_JOBID", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	"SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
}

func TestEnvFromOS(t *testing.T) {
	for _, k := range launchVars {
		if _, ok := os.LookupEnv(k); ok {
			t.Setenv(k, "") // restored after the test; empty reads as unset
		}
	}
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "::1")
	t.Setenv("MASTER_PORT", "4000")
	e, err := EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	if e.Rank != 1 || e.WorldSize != 2 || e.MasterHostPort() != "[::1]:4000" || e.Launcher != launch.Manual {
		t.Fatalf("got %+v (%s)", e, e.MasterHostPort())
	}
}
