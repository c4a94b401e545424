package comm

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Env is where this process sits in a job, as launchers describe it through
// environment variables. EnvFromOS reads it; rpc and other layers reuse it.
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
	// "RANK/WORLD_SIZE" (tandem run, torchrun), "OMPI_COMM_WORLD_*" (mpirun)
	// or "SLURM_*" (srun).
	Source string
}

// Environment variables read by EnvFromOS, in order of preference.
var (
	rankVars       = []string{"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}
	worldVars      = []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}
	localRankVars  = []string{"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}
	localWorldVars = []string{"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}
)

// envHelp says how to get the variables set.
const envHelp = "start the job with `tandem run -nproc N -- PROGRAM` (or torchrun, mpirun, srun), or set the variables yourself"

// EnvFromOS reads the job's layout from the environment:
//
//   - RANK and WORLD_SIZE (set by tandem run and torchrun); when absent,
//     OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI's mpirun),
//     PMI_RANK and PMI_SIZE (MPICH, Intel MPI), then SLURM_PROCID and
//     SLURM_NTASKS (srun);
//   - LOCAL_RANK and LOCAL_WORLD_SIZE, with the same fallbacks
//     (OMPI_COMM_WORLD_LOCAL_*, SLURM_LOCALID; under Slurm on a single node,
//     SLURM_NTASKS is the local world size too);
//   - MASTER_ADDR and MASTER_PORT, the address of rank 0's store.
//
// MASTER_ADDR defaults to 127.0.0.1 only when the job is known to run on
// this machine alone (LOCAL_WORLD_SIZE equals WORLD_SIZE, or a world of
// one); a job spread over machines must name rank 0's host. MASTER_PORT has
// no default: a fixed port would collide between jobs, and launchers pick a
// free one. A world of one needs neither.
//
// Errors wrap ErrInvalidArgument and name the variable and how to set it.
func EnvFromOS() (Env, error) {
	return envFrom(os.LookupEnv)
}

// partialEnv is the environment as found: fields a launcher did not set are
// -1 (or "") so that options can fill them in.
type partialEnv struct {
	Env
	rankVar, worldVar string // which variables supplied rank and world size
	portVar           string
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
	p := partialEnv{Env: Env{Rank: -1, WorldSize: -1, LocalRank: -1, LocalWorldSize: -1}}
	var err error
	if p.Rank, p.rankVar, err = firstInt(lookup, rankVars); err != nil {
		return p, err
	}
	if p.WorldSize, p.worldVar, err = firstInt(lookup, worldVars); err != nil {
		return p, err
	}
	if p.LocalRank, _, err = firstInt(lookup, localRankVars); err != nil {
		return p, err
	}
	if p.LocalWorldSize, _, err = firstInt(lookup, localWorldVars); err != nil {
		return p, err
	}
	if p.LocalWorldSize < 0 && p.worldVar == "SLURM_NTASKS" {
		if nodes, ok := lookup("SLURM_NNODES"); ok && strings.TrimSpace(nodes) == "1" {
			p.LocalWorldSize = p.WorldSize
		}
	}
	switch {
	case p.rankVar == "RANK" || p.worldVar == "WORLD_SIZE":
		p.Source = "RANK/WORLD_SIZE"
	case strings.HasPrefix(p.rankVar, "OMPI_") || strings.HasPrefix(p.worldVar, "OMPI_"):
		p.Source = "OMPI_COMM_WORLD_*"
	case strings.HasPrefix(p.rankVar, "PMI_") || strings.HasPrefix(p.worldVar, "PMI_"):
		p.Source = "PMI_*"
	case strings.HasPrefix(p.rankVar, "SLURM_") || strings.HasPrefix(p.worldVar, "SLURM_"):
		p.Source = "SLURM_*"
	}
	if v, ok := lookup("MASTER_ADDR"); ok {
		p.MasterAddr = strings.TrimSpace(v)
	}
	if v, ok := lookup("MASTER_PORT"); ok && strings.TrimSpace(v) != "" {
		port, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || port < 1 || port > 65535 {
			return p, fmt.Errorf("%w: MASTER_PORT=%q is not a port number (1..65535)", ErrInvalidArgument, v)
		}
		p.MasterPort, p.portVar = port, "MASTER_PORT"
	}
	return p, nil
}

// firstInt returns the value of the first variable of names that is set.
func firstInt(lookup func(string) (string, bool), names []string) (int, string, error) {
	for _, n := range names {
		v, ok := lookup(n)
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		x, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || x < 0 {
			return -1, n, fmt.Errorf("%w: %s=%q is not a non-negative integer", ErrInvalidArgument, n, v)
		}
		return x, n, nil
	}
	return -1, "", nil
}

// complete checks that rank and world size are known and consistent and,
// with needMaster, that the master address is known, filling in its default.
func (p *partialEnv) complete(needMaster bool) error {
	if p.WorldSize < 0 {
		return fmt.Errorf("%w: the world size is not set: set WORLD_SIZE (or pass comm.WithWorldSize); %s", ErrInvalidArgument, envHelp)
	}
	if p.WorldSize < 1 {
		return fmt.Errorf("%w: world size %d (from %s): must be at least 1", ErrInvalidArgument, p.WorldSize, orOption(p.worldVar, "WithWorldSize"))
	}
	if p.Rank < 0 {
		return fmt.Errorf("%w: this process's rank is not set: set RANK (or pass comm.WithRank); %s", ErrInvalidArgument, envHelp)
	}
	if p.Rank >= p.WorldSize {
		return fmt.Errorf("%w: rank %d (from %s) is out of range for world size %d (from %s): ranks run from 0 to %d",
			ErrInvalidArgument, p.Rank, orOption(p.rankVar, "WithRank"), p.WorldSize, orOption(p.worldVar, "WithWorldSize"), p.WorldSize-1)
	}
	if p.LocalWorldSize >= 0 && p.LocalRank >= p.LocalWorldSize {
		return fmt.Errorf("%w: LOCAL_RANK %d is out of range for LOCAL_WORLD_SIZE %d", ErrInvalidArgument, p.LocalRank, p.LocalWorldSize)
	}
	if !needMaster {
		return nil
	}
	if p.WorldSize == 1 {
		if p.MasterAddr == "" && p.MasterPort != 0 {
			p.MasterAddr = "127.0.0.1"
		}
		return nil
	}
	if p.MasterAddr == "" {
		if p.LocalWorldSize != p.WorldSize {
			return fmt.Errorf("%w: MASTER_ADDR is not set: set it to the host name or address of rank 0's machine (it defaults to 127.0.0.1 only when LOCAL_WORLD_SIZE equals WORLD_SIZE); %s",
				ErrInvalidArgument, envHelp)
		}
		p.MasterAddr = "127.0.0.1"
	}
	if p.MasterPort == 0 {
		return fmt.Errorf("%w: MASTER_PORT is not set: set it to a free TCP port on rank 0's machine (the same on every rank); %s",
			ErrInvalidArgument, envHelp)
	}
	return nil
}

func orOption(v, opt string) string {
	if v == "" {
		return "comm." + opt
	}
	return v
}

// MasterHostPort returns MasterAddr:MasterPort, bracketing IPv6 addresses.
func (e Env) MasterHostPort() string {
	return net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.MasterPort))
}
