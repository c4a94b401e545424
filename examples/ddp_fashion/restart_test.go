package main

import (
	"strings"
	"testing"

	"github.com/tandemml/tandem/launch"
)

// TestResumeOnRestart: a worker that its launcher restarted (torchrun's
// TORCHELASTIC_RESTART_COUNT, tandem run's TANDEM_RESTART_COUNT, Slurm's
// SLURM_RESTART_COUNT, read through package launch) resumes from the newest
// checkpoint, as -resume does, instead of deleting the checkpoints its
// failed attempt wrote; a first start does not.
func TestResumeOnRestart(t *testing.T) {
	torchrun := func(count string) []string {
		return []string{"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500",
			"TORCHELASTIC_RUN_ID=none", "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_MAX_RESTARTS=3", "TORCHELASTIC_RESTART_COUNT=" + count}
	}
	for _, tc := range []struct {
		name       string
		env        []string
		out        string
		resume     bool // -resume given
		wantResume bool
		wantNote   []string
	}{
		{name: "torchrun first start", env: torchrun("0"), out: "ckpt"},
		{name: "torchrun restart", env: torchrun("2"), out: "ckpt", wantResume: true,
			wantNote: []string{"restart 2", "TORCHELASTIC_RESTART_COUNT=2", "torchrun", "resuming from the newest checkpoint in ckpt"}},
		{name: "torchrun restart with -resume", env: torchrun("1"), out: "ckpt", resume: true, wantResume: true,
			wantNote: []string{"restart 1", "TORCHELASTIC_RESTART_COUNT=1"}},
		{name: "torchrun restart without -out", env: torchrun("1"), wantNote: []string{"-out is empty", "starting over"}},
		{name: "tandem run restart", env: launch.Job{Rank: 0, WorldSize: 2, LocalRank: 0, LocalWorldSize: 2, NodeRank: 0, NumNodes: 1,
			MasterAddr: "127.0.0.1", MasterPort: 4000, RestartCount: 1, MaxRestarts: 2}.Environ(), out: "ckpt", wantResume: true,
			wantNote: []string{"TANDEM_RESTART_COUNT=1", "tandem run"}},
		{name: "slurm restart", env: []string{"SLURM_PROCID=0", "SLURM_STEP_ID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=7", "SLURM_RESTART_COUNT=1"},
			out: "ckpt", wantResume: true, wantNote: []string{"SLURM_RESTART_COUNT=1", "Slurm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := launch.Read(launch.Lookup(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			cfg := config{Out: tc.out, Resume: tc.resume}
			note := resumeOnRestart(&cfg, job)
			if cfg.Resume != tc.wantResume {
				t.Errorf("Resume = %v, want %v (note %q)", cfg.Resume, tc.wantResume, note)
			}
			if len(tc.wantNote) == 0 && note != "" {
				t.Errorf("note %q on a first start", note)
			}
			for _, w := range tc.wantNote {
				if !strings.Contains(note, w) {
					t.Errorf("note %q lacks %q", note, w)
				}
			}
		})
	}
}
