package launch_test

import (
	"fmt"

	"github.com/tandemml/tandem/launch"
)

// A worker reads its place in the job; here from the variables srun sets
// for task 5 of 6 on three nodes. A real program calls launch.FromEnv().
func Example() {
	env := []string{
		"SLURM_JOB_ID=4242", "SLURM_STEP_ID=1", "SLURM_PROCID=5", "SLURM_NTASKS=6",
		"SLURM_LOCALID=1", "SLURM_NODEID=2", "SLURM_NNODES=3",
		"SLURM_STEP_TASKS_PER_NODE=2(x3)", "SLURM_STEP_NODELIST=node[01-02,07]",
	}
	job, err := launch.From(launch.Lookup(env))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: rank %d of %d, local rank %d of %d, node %d of %d\n",
		job.Launcher, job.Rank, job.WorldSize, job.LocalRank, job.LocalWorldSize, job.NodeRank, job.NumNodes)
	fmt.Printf("rank 0's store: %s (host: %s; port: %s)\n", job.MasterHostPort(), job.Sources.MasterAddr, job.Sources.MasterPort)

	// Without srun the same program says what it found and what to do.
	_, err = launch.From(launch.Lookup([]string{"SLURM_JOB_ID=4242", "SLURM_PROCID=0", "SLURM_NTASKS=6"}))
	fmt.Println(err)
	// Output:
	// Slurm: rank 5 of 6, local rank 1 of 2, node 2 of 3
	// rank 0's store: node01:26667 (host: the first host of SLURM_STEP_NODELIST; port: derived from SLURM_JOB_ID=4242 and SLURM_STEP_ID=1)
	// tandem: invalid argument: launch: detected Slurm: the world size is not known: this is the batch script of Slurm job 4242 (SLURM_NTASKS=6, no SLURM_STEP_ID): start the program with `srun PROGRAM` so that Slurm starts its 6 tasks
}

// A launcher writes a worker's environment: Environ over the launcher's own.
func ExampleJob_Environ() {
	job := launch.Job{
		Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NodeRank: 0, NumNodes: 1,
		MasterAddr: "127.0.0.1", MasterPort: 29500, MaxRestarts: 0, Token: "s3cret",
	}
	env := launch.Overlay([]string{"HOME=/root", "RANK=7"}, job.Environ())
	for _, kv := range env {
		fmt.Println(kv)
	}
	back, _ := launch.From(launch.Lookup(env))
	fmt.Println(back.Launcher, back.Rank, back.WorldSize, back.MasterHostPort())
	// Output:
	// HOME=/root
	// RANK=1
	// WORLD_SIZE=2
	// LOCAL_RANK=1
	// LOCAL_WORLD_SIZE=2
	// GROUP_RANK=0
	// GROUP_WORLD_SIZE=1
	// MASTER_ADDR=127.0.0.1
	// MASTER_PORT=29500
	// TANDEM_TOKEN=s3cret
	// TANDEM_RESTART_COUNT=0
	// TANDEM_MAX_RESTARTS=0
	// TANDEM_RUN_ID=
	// TANDEM_STORE_PREFIX=
	// tandem run 1 2 127.0.0.1:29500
}
