package comm

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/launch"
)

// Env is where this process sits in a job, as launchers describe it through
// environment variables: the part of a launch.Job that comm uses, kept as
// its own type so that code written against earlier versions keeps
// compiling. EnvFromOS reads it through package launch, which holds the
// rules (which launcher set which variable, and what is derived when one is
// missing); use launch.FromEnv for the rest of the job (node rank, restart
// count, token, torchrun's agent store).
type Env struct {
	// Rank is this process's rank, 0 <= Rank < WorldSize.
	Rank int
	// WorldSize is the number of processes in the job.
	WorldSize int
	// LocalRank is the rank among the processes on this machine, and
	// LocalWorldSize their number; both are -1 when the launcher did not say.
	LocalRank      int
	LocalWorldSize int
	// MasterAddr and MasterPort locate rank 0's rendezvous store. MasterAddr
	// is "" and MasterPort 0 when the job needs none (a world of one).
	MasterAddr string
	MasterPort int
	// Source names the variables that rank and world size came from:
	// "RANK/WORLD_SIZE" (tandem run, torchrun, a PyTorchJob, variables set
	// by hand), "OMPI_COMM_WORLD_*" (Open MPI's mpirun), "PMI_*" (MPICH or
	// Intel MPI mpiexec), "SLURM_*" (srun), "PET_*" (a Kubeflow TrainJob)
	// or "JOB_COMPLETION_INDEX" (a Kubernetes indexed Job).
	Source string
	// Launcher is what package launch recognised.
	Launcher launch.Launcher
}

// EnvFromOS reads the job's layout from the environment with
// launch.FromEnv, which knows the variables of tandem run, torchrun,
// Kubeflow's PyTorchJob and TrainJob, Kubernetes indexed Jobs and JobSets,
// Open MPI's mpirun, MPICH's and Intel MPI's mpiexec (PMI) and Slurm's srun.
// In short:
//
//   - RANK and WORLD_SIZE (tandem run, torchrun, a PyTorchJob), else the
//     launcher's own: OMPI_COMM_WORLD_RANK and _SIZE, PMI_RANK and PMI_SIZE,
//     SLURM_PROCID and SLURM_NTASKS, PET_NODE_RANK and PET_NNODES,
//     JOB_COMPLETION_INDEX;
//   - LOCAL_RANK and LOCAL_WORLD_SIZE, with the same fallbacks
//     (OMPI_COMM_WORLD_LOCAL_*, MPI_LOCALRANKID, SLURM_LOCALID and this
//     node's entry of SLURM_STEP_TASKS_PER_NODE, ...);
//   - MASTER_ADDR and MASTER_PORT, the address of rank 0's store.
//
// MASTER_ADDR defaults to 127.0.0.1 when the job is known to run on this
// machine alone (LOCAL_WORLD_SIZE equals WORLD_SIZE, or one node), and
// under srun to the first host of SLURM_STEP_NODELIST. MASTER_PORT defaults
// only where the launcher names the job (Slurm's job id, Open MPI's job id),
// to launch.DerivePort of that id, the same on every rank; otherwise it must
// be set. A world of one needs neither.
//
// Errors wrap ErrInvalidArgument and name the launcher detected, the
// variable and how to set it.
func EnvFromOS() (Env, error) {
	return envFrom(os.LookupEnv)
}

// partialEnv is the environment as found: fields a launcher did not set are
// -1 (or "") so that Init's options and URL can fill them in before
// complete. The *Var fields name where a value came from, for messages.
type partialEnv struct {
	Env
	rankVar, worldVar string // which variables supplied rank and world size
	portVar           string // and the master address and port
	job               launch.Job
}

func envFrom(lookup func(string) (string, bool)) (Env, error) {
	p, err := readEnv(lookup)
	if err != nil {
		return Env{}, err
	}
	if err := p.complete(true); err != nil {
		return Env{}, err
	}
	return p.Env, nil
}

// readEnv parses every variable that is set, without requiring any.
func readEnv(lookup func(string) (string, bool)) (partialEnv, error) {
	j, err := launch.Read(lookup)
	if err != nil {
		return partialEnv{}, err
	}
	p := partialEnv{job: j, rankVar: j.Sources.Rank, worldVar: j.Sources.WorldSize, portVar: j.Sources.MasterPort}
	p.Env = envOf(j)
	return p, nil
}

// complete checks that rank and world size are known and consistent and,
// with needMaster, that the master address is known, filling in its default.
// Values that Init changed (from its options or URL) replace the launcher's.
func (p *partialEnv) complete(needMaster bool) error {
	j := p.job
	if j.Rank != p.Rank || j.Sources.Rank != p.rankVar {
		j.Rank, j.Sources.Rank = p.Rank, p.rankVar
	}
	if j.WorldSize != p.WorldSize || j.Sources.WorldSize != p.worldVar {
		j.WorldSize, j.Sources.WorldSize = p.WorldSize, p.worldVar
	}
	if j.MasterAddr != p.MasterAddr {
		j.MasterAddr, j.Sources.MasterAddr = p.MasterAddr, p.portVar
	}
	if j.MasterPort != p.MasterPort {
		j.MasterPort, j.Sources.MasterPort = p.MasterPort, p.portVar
	}
	if err := j.Resolve(needMaster); err != nil {
		if j.Rank < 0 || j.WorldSize < 0 {
			return fmt.Errorf("%w (a program can also pass comm.WithRank and comm.WithWorldSize)", err)
		}
		return err
	}
	p.job = j
	src := p.Source // the environment's, whatever the options replaced
	p.Env = envOf(j)
	p.Source = src
	return nil
}

// envOf is the part of j that Env holds.
func envOf(j launch.Job) Env {
	return Env{
		Rank: j.Rank, WorldSize: j.WorldSize,
		LocalRank: j.LocalRank, LocalWorldSize: j.LocalWorldSize,
		MasterAddr: j.MasterAddr, MasterPort: j.MasterPort,
		Source: sourceOf(j), Launcher: j.Launcher,
	}
}

// sourceOf names the family of variables the rank came from (Env.Source).
func sourceOf(j launch.Job) string {
	switch src := j.Sources.Rank; {
	case src == "JOB_COMPLETION_INDEX":
		return "JOB_COMPLETION_INDEX"
	case src == "RANK" || j.Sources.WorldSize == "WORLD_SIZE":
		return "RANK/WORLD_SIZE"
	case strings.HasPrefix(src, "OMPI_"):
		return "OMPI_COMM_WORLD_*"
	case strings.HasPrefix(src, "PMI"):
		return "PMI_*"
	case j.Launcher == launch.Slurm:
		return "SLURM_*"
	case strings.HasPrefix(src, "PET_"):
		return "PET_*"
	}
	return ""
}

// MasterHostPort returns MasterAddr:MasterPort, bracketing IPv6 addresses.
func (e Env) MasterHostPort() string {
	return net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.MasterPort))
}
