package launch

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/internal/errs"
)

// Variables that Tandem itself defines. Environ writes them; Read reads them.
const (
	// TokenEnv holds the job's shared secret (Job.Token).
	TokenEnv = "TANDEM_TOKEN"
	// RestartCountEnv counts the restarts of the job's workers, 0 on the
	// first start (Job.RestartCount). Its presence marks a worker of
	// `tandem run`.
	RestartCountEnv = "TANDEM_RESTART_COUNT"
	// MaxRestartsEnv is how many restarts `tandem run` allows (Job.MaxRestarts).
	MaxRestartsEnv = "TANDEM_MAX_RESTARTS"
	// RunIDEnv names the run (Job.RunID), when the launcher gave it one.
	RunIDEnv = "TANDEM_RUN_ID"
)

// Ports derived from a job id (DerivePort) lie in
// [DerivedPortBase, DerivedPortBase+DerivedPortSpan): unprivileged, and
// below Linux's default ephemeral range (32768-60999), so that no outgoing
// connection holds them by chance.
const (
	DerivedPortBase = 20000
	DerivedPortSpan = 10000
)

// DerivePort maps a job id to a TCP port in the derived range: DerivedPortBase
// plus the 32-bit FNV-1a hash of id modulo DerivedPortSpan. Every rank of a
// job computes the same port from the same id; two jobs whose rank 0 shares
// a machine collide with probability 1/DerivedPortSpan, and then rank 0's
// bind fails and names the port (set MASTER_PORT to pick another).
func DerivePort(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return DerivedPortBase + int(h.Sum32()%DerivedPortSpan)
}

// Launcher names what started this process, as Read recognises it from the
// variables it set.
type Launcher int

const (
	// Unknown: none of the variables of any launcher below is set.
	Unknown Launcher = iota
	// Manual: RANK and WORLD_SIZE are set, by hand or by a launcher that
	// leaves no other mark.
	Manual
	// TandemRun: `tandem run` (TANDEM_RESTART_COUNT is set).
	TandemRun
	// Torchrun: torchrun / torch.distributed.elastic (TORCHELASTIC_* set).
	Torchrun
	// Kubeflow: a Kubeflow PyTorchJob (training-operator) or TrainJob
	// (Kubeflow Trainer), which set PET_* variables.
	Kubeflow
	// IndexedJob: a Kubernetes indexed Job, alone or in a JobSet
	// (JOB_COMPLETION_INDEX is set).
	IndexedJob
	// OpenMPI: Open MPI's mpirun / mpiexec (OMPI_COMM_WORLD_* set).
	OpenMPI
	// PMI: an MPI process manager speaking PMI or PMIx, such as MPICH's and
	// Intel MPI's Hydra mpiexec (PMI_RANK, PMI_SIZE, PMIX_RANK).
	PMI
	// Slurm: srun (SLURM_PROCID with SLURM_STEP_ID), or a Slurm batch
	// script outside srun.
	Slurm
)

// String names the launcher for messages.
func (l Launcher) String() string {
	switch l {
	case Unknown:
		return "no launcher"
	case Manual:
		return "RANK/WORLD_SIZE from the environment"
	case TandemRun:
		return "tandem run"
	case Torchrun:
		return "torchrun"
	case Kubeflow:
		return "a Kubeflow PyTorchJob or TrainJob"
	case IndexedJob:
		return "a Kubernetes indexed Job"
	case OpenMPI:
		return "Open MPI"
	case PMI:
		return "an MPI process manager speaking PMI"
	case Slurm:
		return "Slurm"
	}
	return "launcher(" + strconv.Itoa(int(l)) + ")"
}

// Job is where this process sits in a job, as its launcher described it.
// Read fills it from the environment, Resolve checks it and fills in the
// rendezvous defaults, Environ writes it back for a worker to read.
//
// Integer fields a launcher did not give are -1, except RestartCount (0).
type Job struct {
	// Launcher is what Read recognised.
	Launcher Launcher

	// Rank is this process's rank, 0 <= Rank < WorldSize, and WorldSize
	// the number of processes in the job.
	Rank, WorldSize int
	// LocalRank is the rank among the job's processes on this machine, and
	// LocalWorldSize their number.
	LocalRank, LocalWorldSize int
	// NodeRank is the index of this machine (node, pod) among the job's
	// machines (torchrun's GROUP_RANK), and NumNodes their number.
	NodeRank, NumNodes int

	// MasterAddr and MasterPort locate rank 0's rendezvous store.
	// MasterAddr is "" and MasterPort 0 when nothing says where it is; a
	// world of one needs neither.
	MasterAddr string
	MasterPort int
	// AgentStore: the store at MasterAddr:MasterPort is already served, by
	// torchrun's agent, in PyTorch's TCPStore protocol
	// (TORCHELASTIC_USE_AGENT_STORE=True); rank 0 must not serve its own.
	AgentStore bool
	// StorePrefix: the store at MasterAddr:MasterPort is already served, by
	// `tandem store` for an elastic `tandem run` (TANDEM_STORE_PREFIX), in
	// Tandem's protocol; every rank dials it and meets under this key
	// prefix, fresh for each rendezvous round. "" otherwise.
	StorePrefix string

	// RestartCount counts the restarts of this job's workers (0 on the
	// first start) and MaxRestarts how many the launcher allows.
	RestartCount, MaxRestarts int
	// RunID names this run when the launcher gives it a name (torchrun's
	// run id, Slurm's job and step id, Open MPI's job id).
	RunID string
	// Token is the job's shared secret (TANDEM_TOKEN), "" when not given.
	Token string

	// Sources says which variable (or derivation) each field came from,
	// for messages: "RANK", "SLURM_PROCID", "derived from SLURM_JOB_ID=42
	// and SLURM_STEP_ID=0". Callers that override a field set its source.
	Sources Sources

	// hint explains, for Resolve's messages, why the rank or world size
	// is missing; addrHint how to name rank 0's host.
	hint, addrHint string
}

// Sources names where the fields of a Job came from; "" for fields not set.
type Sources struct {
	Rank, WorldSize, LocalRank, LocalWorldSize, NodeRank, NumNodes string
	MasterAddr, MasterPort                                         string
}

// MasterHostPort returns MasterAddr:MasterPort, bracketing IPv6 addresses.
func (j Job) MasterHostPort() string {
	return net.JoinHostPort(j.MasterAddr, strconv.Itoa(j.MasterPort))
}

// FromEnv is From(os.LookupEnv): this process's place in its job, checked,
// with the rendezvous address resolved.
func FromEnv() (Job, error) { return From(os.LookupEnv) }

// From reads the job from the variables lookup returns (os.LookupEnv, or a
// map in tests) with Read, then checks it with Resolve(true): the result has
// a rank, a world size and, unless the world is one process, the address of
// rank 0's store.
func From(lookup func(string) (string, bool)) (Job, error) {
	j, err := Read(lookup)
	if err != nil {
		return j, err
	}
	if err := j.Resolve(true); err != nil {
		return j, err
	}
	return j, nil
}

// Read recognises the launcher and reads every variable it set, without
// requiring any: fields it did not set stay -1 (or ""), so that a caller can
// fill them from elsewhere before Resolve. It fails only on values that
// cannot be read (a rank that is not a number, a port out of range, a
// malformed Slurm node list). See the package documentation for which
// variables each launcher sets and how missing ones are derived.
func Read(lookup func(string) (string, bool)) (Job, error) {
	r := &reader{lookup: lookup}
	j := Job{Rank: -1, WorldSize: -1, LocalRank: -1, LocalWorldSize: -1, NodeRank: -1, NumNodes: -1, MaxRestarts: -1}
	j.Launcher = r.detect()
	r.launcher = j.Launcher
	j.Token, _ = r.get(TokenEnv)

	switch j.Launcher {
	case TandemRun, Torchrun, Manual:
		r.torchStyle(&j)
		switch j.Launcher {
		case TandemRun:
			r.int(&j.RestartCount, nil, RestartCountEnv)
			r.int(&j.MaxRestarts, nil, MaxRestartsEnv)
			j.RunID, _ = r.get(RunIDEnv)
			j.StorePrefix, _ = r.get(StorePrefixEnv)
		case Torchrun:
			r.int(&j.RestartCount, nil, "TORCHELASTIC_RESTART_COUNT")
			r.int(&j.MaxRestarts, nil, "TORCHELASTIC_MAX_RESTARTS")
			j.RunID, _ = r.get("TORCHELASTIC_RUN_ID")
			j.AgentStore = r.bool("TORCHELASTIC_USE_AGENT_STORE")
		}
	case Kubeflow:
		r.kubeflow(&j)
	case IndexedJob:
		r.indexedJob(&j)
	case OpenMPI:
		r.openMPI(&j)
	case PMI:
		r.pmi(&j)
	case Slurm:
		r.slurm(&j)
	}
	r.master(&j)
	if r.err != nil {
		return j, r.err
	}
	return j, nil
}

// reader reads variables, keeping the first error.
type reader struct {
	lookup   func(string) (string, bool)
	launcher Launcher
	err      error
}

// get returns a variable's value, trimmed; set only if non-empty.
func (r *reader) get(name string) (string, bool) {
	v, ok := r.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

func (r *reader) has(names ...string) bool {
	for _, n := range names {
		if _, ok := r.get(n); ok {
			return true
		}
	}
	return false
}

func (r *reader) fail(format string, a ...any) {
	if r.err != nil {
		return
	}
	what := "detected " + r.launcher.String() + ", but "
	if r.launcher == Unknown {
		what = ""
	}
	r.err = fmt.Errorf("%w: launch: %s%s", errs.InvalidArgument, what, fmt.Sprintf(format, a...))
}

// int stores the first of names that is set into *dst, its name into *src
// (when src is not nil), and reports whether one was set.
func (r *reader) int(dst *int, src *string, names ...string) bool {
	for _, n := range names {
		v, ok := r.get(n)
		if !ok {
			continue
		}
		x, err := strconv.Atoi(v)
		if err != nil || x < 0 {
			r.fail("%s=%q is not a non-negative integer", n, v)
			return false
		}
		*dst = x
		if src != nil {
			*src = n
		}
		return true
	}
	return false
}

func (r *reader) bool(name string) bool {
	v, ok := r.get(name)
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail("%s=%q is neither True nor False", name, v)
	}
	return b
}

// detect recognises the launcher. The order matters where launchers nest:
// tandem run and torchrun set RANK over whatever started them; Kubeflow's
// PET_* mark pods whose RANK the operator set; RANK set by hand wins over
// the MPI and Slurm variables; mpirun and mpiexec start their daemons with
// srun inside Slurm allocations, so their variables win over SLURM_*; and a
// program started by mpirun or srun inside an indexed Job's pod is theirs.
func (r *reader) detect() Launcher {
	switch {
	case r.has(RestartCountEnv):
		return TandemRun
	case r.has("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS"):
		return Torchrun
	case r.has("PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR"):
		return Kubeflow
	case r.has("RANK", "WORLD_SIZE"):
		if r.has("JOB_COMPLETION_INDEX") {
			return IndexedJob // RANK set in the pod template, as JobSet's examples do
		}
		return Manual
	case r.has("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
		return OpenMPI
	case r.has("PMI_RANK", "PMI_SIZE", "PMIX_RANK"):
		if r.slurmStepAgrees() {
			return Slurm // srun --mpi=pmi2: Slurm says more (the node list)
		}
		return PMI
	case r.has("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID"):
		return Slurm
	case r.has("JOB_COMPLETION_INDEX"):
		return IndexedJob
	}
	return Unknown
}

// slurmStepAgrees reports whether an srun step set the PMI variables: the
// step's task id and count equal PMI's rank and size.
func (r *reader) slurmStepAgrees() bool {
	if !r.has("SLURM_STEP_ID", "SLURM_STEPID") {
		return false
	}
	pr, _ := r.get("PMI_RANK")
	ps, _ := r.get("PMI_SIZE")
	sr, _ := r.get("SLURM_PROCID")
	ss, ok := r.get("SLURM_STEP_NUM_TASKS")
	if !ok {
		ss, _ = r.get("SLURM_NTASKS")
	}
	return pr != "" && pr == sr && ps == ss
}

// torchStyle reads the variables torchrun and tandem run set.
func (r *reader) torchStyle(j *Job) {
	r.int(&j.Rank, &j.Sources.Rank, "RANK")
	r.int(&j.WorldSize, &j.Sources.WorldSize, "WORLD_SIZE")
	r.int(&j.LocalRank, &j.Sources.LocalRank, "LOCAL_RANK")
	r.int(&j.LocalWorldSize, &j.Sources.LocalWorldSize, "LOCAL_WORLD_SIZE")
	r.int(&j.NodeRank, &j.Sources.NodeRank, "GROUP_RANK")
	r.int(&j.NumNodes, &j.Sources.NumNodes, "GROUP_WORLD_SIZE")
}

// kubeflow reads a PyTorchJob's or a TrainJob's pod. PyTorchJob sets RANK
// (the pod's index: its node rank), WORLD_SIZE (pods times processes per
// pod), PET_NODE_RANK, PET_NNODES, PET_NPROC_PER_NODE and, with a Master
// replica, MASTER_ADDR/PORT and PET_MASTER_ADDR/PORT; TrainJob sets only
// the PET_* variables. Both expect torchrun in the pod to start
// PET_NPROC_PER_NODE processes; a program started directly is one process
// per pod.
func (r *reader) kubeflow(j *Job) {
	r.torchStyle(j)
	r.int(&j.NodeRank, &j.Sources.NodeRank, "PET_NODE_RANK")
	if v, ok := r.get("PET_NNODES"); ok && !strings.Contains(v, ":") { // elastic: "MIN:MAX"
		r.int(&j.NumNodes, &j.Sources.NumNodes, "PET_NNODES")
	}
	nproc, _ := r.get("PET_NPROC_PER_NODE")
	perPod := -1
	if n, err := strconv.Atoi(nproc); err == nil && n > 0 {
		perPod = n
	}
	if j.LocalRank >= 0 {
		return // a per-pod launcher (torchrun, tandem run) set the local fields
	}
	switch {
	case perPod > 1:
		j.hint = fmt.Sprintf("PET_NPROC_PER_NODE=%d asks for %d processes per pod, but this one was started directly "+
			"(RANK, if set, is the pod's index): start them with `tandem run` (or torchrun) in the pod, or set nprocPerNode (numProcPerNode) to 1",
			perPod, perPod)
		j.Rank, j.Sources.Rank = -1, ""
		j.LocalWorldSize, j.Sources.LocalWorldSize = perPod, "PET_NPROC_PER_NODE"
	case perPod == 1 || (j.NumNodes >= 0 && j.NumNodes == j.WorldSize):
		// One process per pod: ranks are pod indexes.
		j.LocalRank, j.Sources.LocalRank = 0, "one process per pod"
		j.LocalWorldSize, j.Sources.LocalWorldSize = 1, "one process per pod"
		if j.Rank < 0 && j.NodeRank >= 0 {
			j.Rank, j.Sources.Rank = j.NodeRank, j.Sources.NodeRank
		}
		if j.WorldSize < 0 && j.NumNodes >= 0 {
			j.WorldSize, j.Sources.WorldSize = j.NumNodes, j.Sources.NumNodes
		}
	default: // "auto", "gpu", "cpu": torchrun decides in the pod
		if j.Rank < 0 || j.WorldSize < 0 {
			j.hint = fmt.Sprintf("PET_NPROC_PER_NODE=%q leaves the number of processes per pod to torchrun: "+
				"set nprocPerNode (numProcPerNode) to a number, or start the processes with `tandem run` in the pod", nproc)
		}
	}
}

// indexedJob reads a pod of a Kubernetes indexed Job (or of a JobSet's
// Job): JOB_COMPLETION_INDEX is the rank unless RANK says otherwise;
// Kubernetes gives no world size or rendezvous address, which the pod
// template must set (WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
func (r *reader) indexedJob(j *Job) {
	r.torchStyle(j)
	var idx int
	if r.int(&idx, nil, "JOB_COMPLETION_INDEX") {
		if j.Rank < 0 {
			j.Rank, j.Sources.Rank = idx, "JOB_COMPLETION_INDEX"
		}
		if j.NodeRank < 0 {
			j.NodeRank, j.Sources.NodeRank = idx, "JOB_COMPLETION_INDEX"
		}
	}
	if j.LocalRank < 0 && j.LocalWorldSize < 0 {
		j.LocalRank, j.Sources.LocalRank = 0, "one process per pod"
		j.LocalWorldSize, j.Sources.LocalWorldSize = 1, "one process per pod"
	}
	// Indexed Jobs name their pods' hosts JOB-INDEX: say what index 0's is.
	if h, ok := r.get("HOSTNAME"); ok && j.NodeRank >= 0 {
		if base, ok := strings.CutSuffix(h, "-"+strconv.Itoa(j.NodeRank)); ok && base != "" {
			j.addrHint = fmt.Sprintf(" (this pod's host name is %s, so index 0's is %s-0)", h, base)
		}
	}
	if j.WorldSize < 0 {
		j.hint = "Kubernetes does not put a Job's completions in the environment: set WORLD_SIZE in the pod template to the number of pods (completions, times replicas in a JobSet)"
	}
}

// openMPI reads what Open MPI's mpirun sets (checked against Open MPI
// 4.1.4): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE, and the
// job id OMPI_MCA_ess_base_jobid (Open MPI 4) or PMIX_NAMESPACE, the same on
// every rank. OMPI_COMM_WORLD_NODE_RANK is not the node's index (it numbers
// this node's processes across jobs) and is not read, nor is
// OMPI_MCA_orte_num_nodes, which counts the daemons of the allocation rather
// than the nodes this job's ranks run on.
func (r *reader) openMPI(j *Job) {
	r.int(&j.Rank, &j.Sources.Rank, "OMPI_COMM_WORLD_RANK")
	r.int(&j.WorldSize, &j.Sources.WorldSize, "OMPI_COMM_WORLD_SIZE")
	r.int(&j.LocalRank, &j.Sources.LocalRank, "OMPI_COMM_WORLD_LOCAL_RANK")
	r.int(&j.LocalWorldSize, &j.Sources.LocalWorldSize, "OMPI_COMM_WORLD_LOCAL_SIZE")
	r.jobID(j, "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")
}

// pmi reads what a PMI process manager sets: PMI_RANK and PMI_SIZE (MPICH
// and Intel MPI Hydra, Slurm's pmi2, Cray PALS), PMIX_RANK (PMIx, which
// puts no size in the environment), MPI_LOCALRANKID and MPI_LOCALNRANKS
// (Hydra), PMI_LOCAL_RANK and PMI_LOCAL_SIZE (Cray PALS), and a job id when
// there is one: PMI_JOBID (Slurm's pmi2) or PMIX_NAMESPACE.
func (r *reader) pmi(j *Job) {
	r.int(&j.Rank, &j.Sources.Rank, "PMI_RANK", "PMIX_RANK")
	r.int(&j.WorldSize, &j.Sources.WorldSize, "PMI_SIZE")
	r.int(&j.LocalRank, &j.Sources.LocalRank, "PMI_LOCAL_RANK", "MPI_LOCALRANKID")
	r.int(&j.LocalWorldSize, &j.Sources.LocalWorldSize, "PMI_LOCAL_SIZE", "MPI_LOCALNRANKS")
	r.jobID(j, "PMI_JOBID", "PMIX_NAMESPACE")
	if j.WorldSize < 0 && j.Rank >= 0 {
		j.hint = fmt.Sprintf("%s gives no world size: pass WORLD_SIZE to every rank (mpiexec -genv WORLD_SIZE N)", j.Sources.Rank)
	}
}

// slurm reads what srun sets (checked against Slurm 22.05): SLURM_PROCID,
// SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, SLURM_NPROCS), SLURM_LOCALID,
// SLURM_NODEID, SLURM_STEP_NUM_NODES (else SLURM_NNODES), this node's entry
// of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, else
// SLURM_NTASKS_PER_NODE), SLURM_JOB_ID and SLURM_STEP_ID, SLURM_RESTART_COUNT,
// and SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST) for
// rank 0's host. A batch script has SLURM_PROCID=0 too, but no step id.
func (r *reader) slurm(j *Job) {
	jobID, _ := r.get("SLURM_JOB_ID")
	if jobID == "" {
		jobID, _ = r.get("SLURM_JOBID")
	}
	stepID, inStep := r.get("SLURM_STEP_ID")
	if !inStep {
		stepID, inStep = r.get("SLURM_STEPID")
	}
	var ntasks int = -1
	r.int(&ntasks, nil, "SLURM_NTASKS", "SLURM_NPROCS")
	if !inStep {
		// The batch script itself: rank 0 of one process, unless the
		// allocation is for more tasks, which only srun starts.
		if ntasks > 1 {
			j.hint = fmt.Sprintf("this is the batch script of Slurm job %s (SLURM_NTASKS=%d, no SLURM_STEP_ID): start the program with `srun PROGRAM` so that Slurm starts its %d tasks", jobID, ntasks, ntasks)
			return
		}
		j.Rank, j.Sources.Rank = 0, "a Slurm batch script"
		j.WorldSize, j.Sources.WorldSize = 1, "a Slurm batch script"
		return
	}
	r.int(&j.Rank, &j.Sources.Rank, "SLURM_PROCID")
	r.int(&j.WorldSize, &j.Sources.WorldSize, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
	r.int(&j.LocalRank, &j.Sources.LocalRank, "SLURM_LOCALID")
	r.int(&j.NodeRank, &j.Sources.NodeRank, "SLURM_NODEID")
	r.int(&j.NumNodes, &j.Sources.NumNodes, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
	r.int(&j.RestartCount, nil, "SLURM_RESTART_COUNT")
	for _, name := range []string{"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"} {
		v, ok := r.get(name)
		if !ok || j.NodeRank < 0 {
			continue
		}
		n, err := tasksOnNode(v, j.NodeRank)
		if errors.Is(err, errNodeBeyond) {
			continue // a list for other nodes than the step's: not this node's count
		}
		if err != nil {
			r.fail("%s=%q: %v", name, v, err)
			return
		}
		j.LocalWorldSize, j.Sources.LocalWorldSize = n, name
		break
	}
	if j.LocalWorldSize < 0 {
		r.int(&j.LocalWorldSize, &j.Sources.LocalWorldSize, "SLURM_NTASKS_PER_NODE")
	}
	if j.LocalWorldSize < 0 && j.NumNodes == 1 && j.WorldSize >= 0 {
		j.LocalWorldSize, j.Sources.LocalWorldSize = j.WorldSize, j.Sources.NumNodes+"=1"
	}
	if jobID != "" {
		j.RunID = jobID + "." + stepID
	}
	if _, ok := r.get("MASTER_ADDR"); !ok && j.NumNodes > 1 {
		for _, name := range []string{"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"} {
			v, ok := r.get(name)
			if !ok {
				continue
			}
			host, err := FirstHost(v)
			if err != nil {
				r.fail("%s cannot be read: %v; set MASTER_ADDR to rank 0's host", name, err)
				return
			}
			j.MasterAddr, j.Sources.MasterAddr = host, "the first host of "+name
			break
		}
	}
	if j.MasterAddr == "" && j.NumNodes == 1 {
		j.MasterAddr, j.Sources.MasterAddr = "127.0.0.1", j.Sources.NumNodes+"=1"
	}
	if _, ok := r.get("MASTER_PORT"); !ok && j.RunID != "" && j.WorldSize > 1 {
		j.MasterPort = DerivePort("slurm:" + j.RunID)
		j.Sources.MasterPort = fmt.Sprintf("derived from SLURM_JOB_ID=%s and SLURM_STEP_ID=%s", jobID, stepID)
	}
}

// jobID sets the run id from the first of names and, when the world has
// more than one process and MASTER_PORT is not set, derives the port.
func (r *reader) jobID(j *Job, names ...string) {
	for _, n := range names {
		v, ok := r.get(n)
		if !ok {
			continue
		}
		j.RunID = v
		if _, set := r.get("MASTER_PORT"); !set && j.WorldSize > 1 {
			j.MasterPort = DerivePort(n + ":" + v)
			j.Sources.MasterPort = fmt.Sprintf("derived from %s=%s", n, v)
		}
		return
	}
}

// master reads MASTER_ADDR and MASTER_PORT, which win over every derived
// value, and the PET_MASTER_* fallbacks under Kubeflow.
func (r *reader) master(j *Job) {
	addrs := []string{"MASTER_ADDR"}
	ports := []string{"MASTER_PORT"}
	if j.Launcher == Kubeflow {
		addrs = append(addrs, "PET_MASTER_ADDR")
		ports = append(ports, "PET_MASTER_PORT")
	}
	for _, n := range addrs {
		if v, ok := r.get(n); ok {
			j.MasterAddr, j.Sources.MasterAddr = v, n
			break
		}
	}
	for _, n := range ports {
		v, ok := r.get(n)
		if !ok {
			continue
		}
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			r.fail("%s=%q is not a port number (1..65535)", n, v)
			return
		}
		j.MasterPort, j.Sources.MasterPort = p, n
		break
	}
}

// tasksOnNode returns node's entry of a Slurm tasks-per-node list such as
// "2(x3),1": two tasks on each of the first three nodes, one on the fourth.
func tasksOnNode(list string, node int) (int, error) {
	seen := 0
	for _, item := range strings.Split(list, ",") {
		count, rep := item, "1"
		if c, r, ok := strings.Cut(item, "(x"); ok {
			if !strings.HasSuffix(r, ")") {
				return 0, fmt.Errorf("entry %q is not N or N(xM)", item)
			}
			count, rep = c, strings.TrimSuffix(r, ")")
		}
		n, err1 := strconv.Atoi(count)
		m, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || n < 0 || m < 1 {
			return 0, fmt.Errorf("entry %q is not N or N(xM)", item)
		}
		if node < seen+m {
			return n, nil
		}
		seen += m
	}
	return 0, fmt.Errorf("%w: it lists %d nodes, and this is node %d (SLURM_NODEID)", errNodeBeyond, seen, node)
}

// errNodeBeyond: a tasks-per-node list shorter than this node's index.
var errNodeBeyond = errors.New("node beyond the list")

// Resolve checks that the job is complete and consistent, and with
// needRendezvous fills in MasterAddr when every rank runs on this machine
// (LocalWorldSize equals WorldSize, or NumNodes is 1: 127.0.0.1). Its
// errors wrap errs.InvalidArgument, name the launcher Read detected, what is
// missing or inconsistent, and how to fix it. A world of one needs no
// rendezvous address.
func (j *Job) Resolve(needRendezvous bool) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: launch: %s: "+format, append([]any{errs.InvalidArgument, j.detected()}, a...)...)
	}
	switch {
	case j.Launcher == Unknown && j.Rank < 0 && j.WorldSize < 0:
		return fmt.Errorf("%w: launch: no launcher detected (none of RANK and WORLD_SIZE, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, PET_NODE_RANK, JOB_COMPLETION_INDEX is set): %s",
			errs.InvalidArgument, startHelp)
	case j.WorldSize < 0:
		return bad("the world size is not known: %s", j.fix("set WORLD_SIZE to the number of processes"))
	case j.WorldSize < 1:
		return bad("world size %d (from %s) must be at least 1", j.WorldSize, j.src(j.Sources.WorldSize))
	case j.Rank < 0:
		return bad("this process's rank is not known: %s", j.fix("set RANK"))
	case j.Rank >= j.WorldSize:
		return bad("rank %d (from %s) is out of range for world size %d (from %s): ranks run from 0 to %d",
			j.Rank, j.src(j.Sources.Rank), j.WorldSize, j.src(j.Sources.WorldSize), j.WorldSize-1)
	case j.LocalWorldSize > j.WorldSize:
		return bad("local world size %d (from %s) exceeds the world size %d (from %s)",
			j.LocalWorldSize, j.src(j.Sources.LocalWorldSize), j.WorldSize, j.src(j.Sources.WorldSize))
	case j.LocalWorldSize == 0:
		return bad("local world size 0 (from %s): this process runs here, so it is at least 1", j.src(j.Sources.LocalWorldSize))
	case j.LocalWorldSize > 0 && j.LocalRank >= j.LocalWorldSize:
		return bad("local rank %d (from %s) is out of range for local world size %d (from %s)",
			j.LocalRank, j.src(j.Sources.LocalRank), j.LocalWorldSize, j.src(j.Sources.LocalWorldSize))
	case j.NumNodes == 0 || j.NumNodes > j.WorldSize:
		return bad("%d nodes (from %s) cannot hold %d processes", j.NumNodes, j.src(j.Sources.NumNodes), j.WorldSize)
	case j.NumNodes > 0 && j.NodeRank >= j.NumNodes:
		return bad("node rank %d (from %s) is out of range for %d nodes (from %s)",
			j.NodeRank, j.src(j.Sources.NodeRank), j.NumNodes, j.src(j.Sources.NumNodes))
	case j.MasterPort < 0 || j.MasterPort > 65535:
		return bad("port %d (from %s) is not a port number (1..65535)", j.MasterPort, j.src(j.Sources.MasterPort))
	}
	if !needRendezvous {
		return nil
	}
	if j.WorldSize == 1 {
		if j.MasterAddr == "" && j.MasterPort != 0 {
			j.MasterAddr, j.Sources.MasterAddr = "127.0.0.1", "a world of one"
		}
		return nil
	}
	if j.MasterAddr == "" {
		switch {
		case j.LocalWorldSize == j.WorldSize:
			j.MasterAddr, j.Sources.MasterAddr = "127.0.0.1", "every rank on this machine ("+j.Sources.LocalWorldSize+" equals "+j.Sources.WorldSize+")"
		case j.NumNodes == 1:
			j.MasterAddr, j.Sources.MasterAddr = "127.0.0.1", "every rank on this machine ("+j.Sources.NumNodes+"=1)"
		default:
			return bad("rank 0's host is not known: %s", j.addrFix())
		}
	}
	if j.MasterPort == 0 {
		return bad("no rendezvous port: %s", j.portFix())
	}
	return nil
}

// startHelp says how to get a job's variables set.
const startHelp = "start the job with `tandem run -nproc N -- PROGRAM` (or torchrun, mpirun, srun), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself"

// detected describes the launcher and, when known, this process's place.
func (j *Job) detected() string {
	s := "detected " + j.Launcher.String()
	if j.Launcher == Unknown {
		s = "no launcher detected"
	}
	if j.Rank >= 0 && j.WorldSize >= 0 && j.Sources.Rank != "" {
		s += fmt.Sprintf(" (%s=%d of %d)", j.Sources.Rank, j.Rank, j.WorldSize)
	}
	return s
}

func (j *Job) src(s string) string {
	if s == "" {
		return "the caller"
	}
	return s
}

// fix returns the launcher's hint, or the generic advice.
func (j *Job) fix(generic string) string {
	if j.hint != "" {
		return j.hint
	}
	return j.advice(nil, generic)
}

// advice returns the advice byLauncher gives for this job's launcher, else
// generic, with how to start the ranks when no launcher was recognised.
func (j *Job) advice(byLauncher map[Launcher]string, generic string) string {
	if s, ok := byLauncher[j.Launcher]; ok {
		return s
	}
	if j.Launcher == Manual || j.Launcher == Unknown {
		return generic + "; " + startHelp
	}
	return generic
}

const (
	addrGeneric = "set MASTER_ADDR to the host name or address of rank 0's machine (it defaults to 127.0.0.1 only when LOCAL_WORLD_SIZE equals WORLD_SIZE)"
	portGeneric = "set MASTER_PORT to a free TCP port on rank 0's machine, the same on every rank"
)

// addrAdvice says how to name rank 0's host under the launchers that do
// not say it themselves.
var addrAdvice = map[Launcher]string{
	OpenMPI:    "the ranks span several hosts and Open MPI does not say which runs rank 0: pass its name to every rank, `mpirun -x MASTER_ADDR=HOST ...` (on one host the ranks meet at 127.0.0.1 by themselves)",
	PMI:        "the ranks span several hosts and the process manager does not say which runs rank 0: pass its name to every rank, `mpiexec -genv MASTER_ADDR HOST ...`",
	Slurm:      "Slurm gave no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST): set MASTER_ADDR, e.g. `export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)`",
	Kubeflow:   "a PyTorchJob sets MASTER_ADDR only when it has a Master replica: add one (replica type Master), or set MASTER_ADDR to rank 0's pod",
	IndexedJob: "set MASTER_ADDR in the pod template to the stable name of index 0's pod: `JOB-0.SUBDOMAIN` for an indexed Job with a headless Service as spec.subdomain, `JOBSET-REPLICATEDJOB-0-0.JOBSET` for a JobSet",
}

// portAdvice says how to pick the rendezvous port under the launchers
// that give no job id to derive one from.
var portAdvice = map[Launcher]string{
	OpenMPI: "Open MPI gave no job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE) to derive one from: pass a free port to every rank, `mpirun -x MASTER_PORT=PORT ...`",
	PMI:     "the process manager gives no job id (PMI_JOBID, PMIX_NAMESPACE) to derive one from: pass a free port to every rank, `mpiexec -genv MASTER_PORT PORT ...`",
	Slurm:   "Slurm gave no job id (SLURM_JOB_ID) to derive one from: " + portGeneric,
}

// addrFix says how to name rank 0's host under this launcher.
func (j *Job) addrFix() string {
	s := j.advice(addrAdvice, addrGeneric)
	if j.Launcher == IndexedJob {
		s += j.addrHint
	}
	return s
}

// portFix says how to pick the rendezvous port under this launcher.
func (j *Job) portFix() string { return j.advice(portAdvice, portGeneric) }
