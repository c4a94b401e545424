package comm

import (
	"errors"
	"strings"
	"testing"
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
		{"tandem run / torchrun",
			map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
			Env{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "node0", MasterPort: 29500, Source: "RANK/WORLD_SIZE"}},
		{"single machine defaults MASTER_ADDR",
			map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1234"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1234, Source: "RANK/WORLD_SIZE"}},
		{"mpirun (Open MPI)",
			map[string]string{"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "5000"},
			Env{Rank: 2, WorldSize: 4, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "10.0.0.1", MasterPort: 5000, Source: "OMPI_COMM_WORLD_*"}},
		{"srun on one node",
			map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1", "SLURM_NNODES": "1", "MASTER_PORT": "7000"},
			Env{Rank: 1, WorldSize: 3, LocalRank: 1, LocalWorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: 7000, Source: "SLURM_*"}},
		{"RANK wins over fallbacks",
			map[string]string{"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "5", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			Env{Rank: 0, WorldSize: 2, LocalRank: -1, LocalWorldSize: -1, MasterAddr: "h", MasterPort: 1, Source: "RANK/WORLD_SIZE"}},
		{"world of one needs no master",
			map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			Env{Rank: 0, WorldSize: 1, LocalRank: -1, LocalWorldSize: -1, Source: "RANK/WORLD_SIZE"}},
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
		{"nothing set", map[string]string{}, []string{"WORLD_SIZE", "tandem run"}},
		{"no rank", map[string]string{"WORLD_SIZE": "2"}, []string{"RANK", "tandem run"}},
		{"rank out of range", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, []string{"rank 2", "RANK", "world size 2", "0 to 1"}},
		{"bad integer", map[string]string{"RANK": "one", "WORLD_SIZE": "2"}, []string{`RANK="one"`}},
		{"zero world", map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, []string{"at least 1"}},
		{"no master addr across machines", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, []string{"MASTER_ADDR", "rank 0"}},
		{"no master port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, []string{"MASTER_PORT", "tandem run"}},
		{"bad port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, []string{"MASTER_PORT", "70000"}},
		{"local rank out of range", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1"}, []string{"LOCAL_RANK 2"}},
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

func TestEnvFromOS(t *testing.T) {
	for _, k := range append(append(append(append([]string{"MASTER_ADDR", "MASTER_PORT"}, rankVars...), worldVars...), localRankVars...), localWorldVars...) {
		t.Setenv(k, "")
	}
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "::1")
	t.Setenv("MASTER_PORT", "4000")
	e, err := EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	if e.Rank != 1 || e.WorldSize != 2 || e.MasterHostPort() != "[::1]:4000" {
		t.Fatalf("got %+v (%s)", e, e.MasterHostPort())
	}
}
