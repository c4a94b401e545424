// Package launch is Tandem's one contract with the programs that start its
// processes: it reads where this process sits in a job (Read, From,
// FromEnv) from the environment that torchrun, Kubeflow, Kubernetes, Open
// MPI, MPICH, Slurm or `tandem run` set, and writes that environment for a
// worker (Job.Environ, Overlay), so that every layer reads the same
// variables by the same rules: comm.EnvFromOS and comm.Init read through it.
// A launcher of its own (`tandem run` inside a Slurm allocation or a
// Kubeflow pod) can use Read's NodeRank, NumNodes, LocalWorldSize and
// master address as its defaults. Rendezvous is the protocol by which the
// agents of an elastic `tandem run` agree on each round's nodes and ranks
// (see Elastic rendezvous below). It depends on nothing but the standard
// library and internal/errs.
//
// # Launchers and their variables
//
// Read recognises the launcher (Job.Launcher) by the variables it sets, in
// this order, and reads:
//
//   - tandem run (TANDEM_RESTART_COUNT is set): RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT, TANDEM_RESTART_COUNT, TANDEM_MAX_RESTARTS,
//     TANDEM_RUN_ID, TANDEM_STORE_PREFIX: what Job.Environ writes.
//   - torchrun (any TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT,
//     TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE): the same
//     torch-style variables, and TORCHELASTIC_RESTART_COUNT,
//     TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID. With
//     TORCHELASTIC_USE_AGENT_STORE=True (torchrun's static rendezvous, its
//     default) torchrun's agent already serves a PyTorch TCPStore at
//     MASTER_ADDR:MASTER_PORT: Job.AgentStore. Checked against torch 1.13's
//     torchrun, single node, --standalone and two nodes (testdata).
//   - Kubeflow (any PET_NODE_RANK, PET_NNODES, PET_NPROC_PER_NODE,
//     PET_MASTER_ADDR): a PyTorchJob (training-operator v1.9) sets RANK to
//     the pod's index (Master 0, Worker i at i+1), WORLD_SIZE to pods times
//     processes per pod, PET_NODE_RANK, PET_NNODES (a number, or MIN:MAX
//     when elastic), PET_NPROC_PER_NODE (default "auto") and, when it has a
//     Master replica, MASTER_ADDR=JOB-master-0, MASTER_PORT and their PET_
//     twins; a TrainJob (Kubeflow Trainer) sets only PET_NNODES,
//     PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's completion index),
//     PET_MASTER_ADDR=JOB-node-0-0.JOB and PET_MASTER_PORT=29500. Both
//     expect torchrun in the pod; a program started directly is one process
//     per pod, which works when PET_NPROC_PER_NODE is 1 (or when WORLD_SIZE
//     equals PET_NNODES) and otherwise is an error that says to start the
//     pod's processes with `tandem run`.
//   - RANK or WORLD_SIZE set with no mark of the above: taken as they are
//     (Manual), with LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//     GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with
//     JOB_COMPLETION_INDEX also set, as in JobSet's examples, the launcher
//     is IndexedJob.
//   - Open MPI (OMPI_COMM_WORLD_RANK or _SIZE): OMPI_COMM_WORLD_RANK, _SIZE,
//     _LOCAL_RANK, _LOCAL_SIZE; the job id OMPI_MCA_ess_base_jobid (Open MPI
//     4) or PMIX_NAMESPACE. Checked against Open MPI 4.1.4's mpirun
//     (testdata). OMPI_COMM_WORLD_NODE_RANK is not a node index and is not
//     used.
//   - PMI (PMI_RANK, PMI_SIZE or PMIX_RANK, unless an srun step with the
//     same rank and size set them, which is Slurm): PMI_RANK (else
//     PMIX_RANK), PMI_SIZE, PMI_LOCAL_RANK or MPI_LOCALRANKID,
//     PMI_LOCAL_SIZE or MPI_LOCALNRANKS, and the job id PMI_JOBID or
//     PMIX_NAMESPACE when there is one. Checked against MPICH 4.0.2's Hydra
//     mpiexec, which sets no job id, and Slurm's --mpi=pmi2 (testdata).
//   - Slurm (SLURM_PROCID, SLURM_STEP_ID): SLURM_PROCID,
//     SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, SLURM_NPROCS), SLURM_LOCALID,
//     SLURM_NODEID, SLURM_STEP_NUM_NODES (else SLURM_NNODES,
//     SLURM_JOB_NUM_NODES), this node's entry of SLURM_STEP_TASKS_PER_NODE
//     (else SLURM_TASKS_PER_NODE, "2(x3),1" lists; else
//     SLURM_NTASKS_PER_NODE), SLURM_JOB_ID, SLURM_STEP_ID,
//     SLURM_RESTART_COUNT, and the first host of SLURM_STEP_NODELIST (else
//     SLURM_JOB_NODELIST, SLURM_NODELIST) as rank 0's host, which holds for
//     srun's block and cyclic distributions (not for -m arbitrary: set
//     MASTER_ADDR there). A batch script outside srun has SLURM_PROCID=0
//     but no step id: it is a world of one when the allocation has one
//     task, and an error that says to use srun otherwise. Checked against
//     Slurm 22.05's srun and sbatch on one node (testdata); multi-node
//     values follow Slurm's documentation.
//   - Kubernetes indexed Job or JobSet (JOB_COMPLETION_INDEX): the rank is
//     RANK if set, else JOB_COMPLETION_INDEX; one process per pod (unless
//     LOCAL_RANK and LOCAL_WORLD_SIZE say otherwise). Kubernetes and JobSet
//     put neither the world size nor rank 0's address in the environment
//     (JobSet's labels and annotations reach it only through the downward
//     API): the pod template sets WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
//
// Under every launcher TANDEM_TOKEN is the job's token (Job.Token), and
// MASTER_ADDR and MASTER_PORT, when set, win over anything derived.
//
// # Meeting without MASTER_ADDR and MASTER_PORT
//
// Rank 0 serves the rendezvous store; the others must know where. When the
// launcher does not say:
//
//   - Host: 127.0.0.1 when every rank runs on this machine (LOCAL_WORLD_SIZE
//     equals WORLD_SIZE, or the launcher counts one node); under Slurm, the
//     first host of the step's node list. Open MPI and PMI process managers
//     do not say which host runs rank 0, so a job over several hosts must
//     pass MASTER_ADDR (mpirun -x MASTER_ADDR=HOST, mpiexec -genv
//     MASTER_ADDR HOST); so must an indexed Job's pod template. (Open MPI 4
//     does name mpirun's own host, in OMPI_MCA_orte_hnp_uri, but rank 0 runs
//     wherever the mapping puts it, which need not be there; Open MPI 5
//     does not set the variable.)
//   - Port: derived from the launcher's job id with DerivePort, the same on
//     every rank: "slurm:JOBID.STEPID" under Slurm,
//     "OMPI_MCA_ess_base_jobid:ID" or "PMIX_NAMESPACE:NS" under Open MPI,
//     "PMI_JOBID:ID" under Slurm's PMI. Ports lie in [20000, 30000), below
//     Linux's ephemeral range. MPICH's Hydra gives no job id: pass
//     MASTER_PORT (mpiexec -genv MASTER_PORT PORT).
//
// A world of one needs neither.
//
// # Elastic rendezvous
//
// Rendezvous is the protocol that elastic `tandem run -nnodes MIN:MAX
// -rdzv-endpoint HOST:PORT -rdzv-id RUNID` agents speak, in the manner of
// torch's c10d rendezvous. The agents meet in a store that no training node
// hosts (a standalone `tandem store`; any comm/store.Store satisfies
// RendezvousStore), so losing any node, rank 0's included, leaves the
// rendezvous intact. The run's state is one JSON value under
// "RUNID/rdzv/state", changed only by compare-and-set: the round number,
// whether the round has formed, its members, the nodes waiting for the next
// round, and why the round was opened. Each agent bumps its counter
// "RUNID/rdzv/hb/NODE" every Heartbeat (1 s); another agent that sees a
// counter stand still for LostAfter (3 s) by its own clock counts that node
// lost, so the nodes' clocks need not agree.
//
// Join forms round N: it closes at once with MaxNodes members; with fewer
// (but MinNodes), round 0 closes after the last call (LastCall, 1 s, from
// when MinNodes were there), and a round opened by a restart as soon as
// every member of the previous round and every node that was waiting has
// joined or is lost (at most RejoinWait after MinNodes). Members whose
// heartbeat stops are dropped; a round without MinNodes after JoinTimeout
// (60 s) is an error. Node ranks follow the previous round's order, then
// newcomers in the order they joined. While the round runs, Watch ends it
// when a member is lost or a node is waiting (one that arrived while the
// round ran: it registers and waits), Restart ends it after a worker
// failed, and every agent stops its workers and joins round N+1. Round N's
// workers get TANDEM_RESTART_COUNT=N, the round's WORLD_SIZE, and
// TANDEM_STORE_PREFIX=RUNID/round/N (Job.StorePrefix) with MASTER_ADDR and
// MASTER_PORT naming the rendezvous store, where comm.InitFromEnv meets
// under that prefix. A restart past MaxRestarts marks the run failed, and
// every agent's next call returns ErrRunFailed. Finish is the exit barrier:
// once every member's workers exited 0 the run is complete, and an agent
// that arrives later gets ErrRunComplete.
//
// # Debugging
//
// DebugFrom reads the debug level from TANDEM_DEBUG, else PyTorch's
// TORCH_DISTRIBUTED_DEBUG (OFF, INFO or DETAIL), and the directory for
// flight-recorder dumps from TANDEM_FLIGHT_DIR, else one under
// os.TempDir() named after the run id (TANDEM_RUN_ID, TORCHELASTIC_RUN_ID)
// or, without one, this process. comm.NewProcessGroup reads them through it.
//
// # Errors
//
// Read fails on values that cannot be read; Resolve on jobs that are
// incomplete or inconsistent (a rank not below the world size, a local world
// larger than the world, a local rank not below the local world size, a node
// rank not below the node count). Every error wraps errs.InvalidArgument
// (comm.ErrInvalidArgument), names the launcher detected, what is missing,
// and how to fix it under that launcher.
package launch
