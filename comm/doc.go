// Package comm is Tandem's collective communication layer: the user-facing
// ProcessGroup with PyTorch c10d semantics (all-reduce, broadcast, reduce,
// all-gather, gather, scatter, reduce-scatter, all-to-all, barriers,
// point-to-point messages, object collectives and subgroups).
//
// A program started by a launcher (tandem run, torchrun, mpirun, srun,
// Kubernetes) joins its job with one call, InitFromEnv, and then runs
// collectives on the group it returns:
//
//	pg, err := comm.InitFromEnv(ctx)
//	if err != nil {
//		return err
//	}
//	defer pg.Close()
//	err = pg.AllReduce(ctx, grad, comm.Sum).Wait(ctx) // grad is now the sum over the ranks
//
// InitFromEnv is torch.distributed.init_process_group with
// init_method="env://": it reads the rank, the world size and where rank 0
// is from the launcher's environment, meets the other ranks there and picks
// the transport (see "Joining a job" below). Init does the same from a
// tcp:// or file:// URL, or WithStore from a store of the caller's.
//
// # Backends
//
// comm is to its backends what database/sql is to its drivers: a backend
// (comm/tcp for processes over sockets, comm/shm for processes of one host,
// comm/local for goroutine ranks in one process) provides a
// transport.Transport, the small point-to-point interface in comm/transport,
// and registers itself by name with Register; the algorithms (ring,
// recursive doubling, binomial trees, pairwise exchange) are written once,
// here, and know nothing of sockets. A group can also be built on a
// transport connected by hand:
//
//	t, _ := backend.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st})
//	pg, err := comm.NewProcessGroup(ctx, t)
//
// In tests and single-process programs, local.NewGroups(ctx, n) returns n
// groups whose ranks are goroutines.
//
// # Joining a job
//
// InitFromEnv works the same whatever the launcher: package launch reads the
// environment of tandem run, torchrun, Kubeflow's PyTorchJob and TrainJob,
// Kubernetes indexed Jobs and JobSets, Open MPI's mpirun, MPICH's mpiexec
// (PMI) and Slurm's srun, by one set of rules that rpc.InitFromEnv and
// tandem run share, and its errors name the launcher it detected, what is
// missing and how to set it under that launcher. Rank 0 serves the
// rendezvous store at MASTER_ADDR:MASTER_PORT (derived from the job id
// under Slurm and Open MPI when not set) and the others dial it; under
// torchrun's static rendezvous (its default, TORCHELASTIC_USE_AGENT_STORE=
// True) torchrun's agent already serves a PyTorch TCPStore there, and every
// rank joins that one instead (see InitFromEnv); under an elastic
// `tandem run -rdzv-endpoint`, `tandem store` serves Tandem's store there and
// every rank joins it under the round's TANDEM_STORE_PREFIX. Init with tcp:// or
// file:// URLs, or WithStore, meets elsewhere.
//
// Init chooses the transport from where the ranks run (AutoBackend): each
// rank publishes its host's identity (boot id, network, mount and PID
// namespaces) in the store, and a world whose ranks all share one host
// connects through shared memory (comm/shm), a world of one rank per host
// through TCP, and a world of several hosts with several ranks on some
// through both, all-reduce then running hierarchically (inside each host,
// between hosts, inside each host again). WithBackend or TANDEM_BACKEND
// (tcp, shm, auto or any registered name) overrides the choice.
//
// # Semantics
//
// Every operation returns at once; the returned Work completes when the
// operation has finished on this rank. Collectives of one group run on each
// rank in the order they were issued on that rank, one at a time; collectives
// of different groups, and point-to-point messages, run concurrently.
// Collectives match across ranks by a per-group sequence number: each rank's
// k-th collective of a group is matched with every other rank's k-th. Each
// carries a fingerprint (operation, dtype, shape, root, reduce op) that every
// rank sends to every other member of the group before its data moves and
// checks against the others' when the data has moved (or beside the data,
// for a collective still running after a few milliseconds, so that ranks
// waiting on each other's mismatched messages fail at once); when two ranks
// disagree, the collective fails on every rank with an error wrapping
// ErrMismatch that names both sides, and no rank reports success. An
// all-reduce small enough for one buffer of the group's staging segment
// carries its fingerprint in the segment instead, once the segment is
// mapped: ranks that agree then exchange no message at all, and ranks that
// disagree settle it through the transport as above. Each group
// runs its collectives on one goroutine of its own, started with its first
// collective and ended by Close.
//
// Failures are bounded in time: every operation is bounded by its context or,
// when the context has no deadline, by the group's default timeout
// (WithTimeout). When a collective fails because a peer was lost or a deadline
// expired, the group aborts its transport, so that every other rank fails with
// ErrPeerLost within moments instead of waiting for its own deadline. A group
// that was aborted stays unusable; build a new one.
//
// A peer that freezes (stopped, swapped out) or whose link is cut closes
// nothing; the built-in TCP backend notices it by its silence: idle links
// carry a heartbeat every second, and a peer from which nothing has come
// for the peer timeout (5 s by default; WithPeerTimeout at Init, or
// comm/tcp.WithPeerTimeout) is failed with an error wrapping ErrPeerLost
// that calls it unresponsive and says since when. The collective waiting
// on it fails with that error and aborts the group, so every rank stops
// within seconds rather than at the end of the operation's timeout, and no
// rank reports the frozen one as having skipped the collective. An error
// saying that a rank "never joined" a collective is kept for a rank that
// is alive but did not call it (a different number or order of
// collectives, or a rank busy elsewhere past the deadline). Errors wrap the sentinels
// ErrTimeout, ErrPeerLost, ErrClosed, ErrMismatch, ErrInvalidArgument and
// ErrTooLarge; test them with errors.Is.
//
// One rule for contexts holds in comm, its backends, comm/store and rpc: an
// operation that gives up at its context's deadline (or the group's
// default timeout) fails with an error wrapping both ErrTimeout and
// context.DeadlineExceeded; one whose context was cancelled fails with an
// error wrapping context.Canceled, and not ErrTimeout. A nil context is a
// programming error, refused with ErrInvalidArgument. Messages read
// "pkg: operation: detail: cause".
//
// # Staged collectives
//
// When every rank of a group runs on one host (the shm backend, or
// in-process ranks), all-reduces, broadcasts, reduces, gathers,
// all-gathers and reduce-scatters of ordinary tensors go through a staging
// segment in /dev/shm (WithSharedDir names another directory) that the
// group maps on its first such collective
// (three buffers of at least 2 MiB a rank): each rank copies what it
// contributes into its buffers, and the ranks read, or reduce, straight out
// of each other's, synchronised by words in the segment rather than
// messages, one barrier a round. A reduction that fits a buffer goes
// through in one round; a larger one in blocks the size of one core's
// level-2 cache on rank 0's machine (256 KiB to 4 MiB; 2 MiB where the
// system does not say), or of 32 MiB where the group's ranks outnumber
// rank 0's CPUs and /dev/shm holds twice the larger segment (ranks that
// take turns on the CPUs evict each other's blocks anyway, and every block
// costs a barrier). An all-reduce below the ring threshold is reduced whole by
// every rank, in rank order, after one barrier; above it each rank reduces
// its share of each block and the others copy it. Every rank ends with the
// same bits. A rank that dies or freezes while the others wait fails their
// collective with ErrPeerLost, as through the transport. WithStaging(false)
// turns it off; a segment that cannot be mapped (a /dev/shm too small)
// leaves the group's collectives on the transport, and the group's logger
// says why. Float16 and bfloat16 reductions stage too, combined in
// float32 and rounded once, bit for bit as through the transport. A staged
// reduce leaves the other ranks' tensors as they were: each stages all of
// its tensor and reduces its share of each block in its own buffer, from
// which the root copies it. Scatter, all-to-all, and the hierarchical
// all-reduce of several hosts go through the transport.
//
// # Shared tensors
//
// When every rank of a group runs on one host (the shm backend, or
// in-process ranks), NewSharedTensor makes a tensor in memory that every
// member maps, one region a rank (a collective; Close gives it back, the
// tensor keeping its values). An all-reduce of such a tensor, or of a
// contiguous part of it at the same place on every rank, runs in place:
// each rank reduces its share of every block straight out of the others'
// regions and copies theirs, with barriers between, and no data goes
// through the transport. DDP keeps its buckets there (ddp.SharedBuckets,
// on by default). Where the memory cannot be had (a /dev/shm without room
// for every member's region), NewSharedTensor fails on every member alike
// with ErrSharedUnavailable and the group goes on; DDP then keeps that
// bucket and the later ones in private memory. Other collectives of
// shared tensors run as usual.
//
// # Seeing inside a job
//
// Every group keeps a flight recorder: a ring, allocated with the group, of
// its last DefaultFlightRecorderSize operations (WithFlightRecorder), each
// with its sequence number, kind, fingerprint (dtype, shape, reduction),
// the times it was issued, started and ended, and its state and error.
// Sends and receives are recorded beside the collectives, numbered in
// their stream (peer, tag and direction: send n matches the peer's
// receive n) rather than among the collectives, with their peer and tag
// (FlightOp.P2P). When
// the world aborts (a timeout, a lost or unresponsive peer, Abort), each
// rank writes the records of all its groups to its own JSON file
// (FlightRecord, named by FlightFileName) in the flight directory
// (WithFlightDir, else $TANDEM_FLIGHT_DIR, else
// os.TempDir()/tandem-flight-RUNID); DumpFlightRecord and
// WriteFlightRecord write it on request, and DumpOnSignal on SIGUSR1.
// `tandem debug DIR` merges the ranks' files and says which rank did not
// reach which operation, or which ranks disagree, and since when, and
// which send or receive waits for a peer that did not issue its match.
// Recording costs about 0.2 µs per operation and allocates nothing of its
// own.
//
// The debug level (WithDebugLevel, else TANDEM_DEBUG or PyTorch's
// TORCH_DISTRIBUTED_DEBUG: OFF, INFO or DETAIL; see package launch) makes
// Init log the rendezvous (every rank's host and process, the world size,
// the store and how long the meeting took) and a group log its creation and
// install DumpOnSignal at INFO, and at DETAIL also log every collective,
// send and receive and keep the stack that issued it in the record.
// Without WithLogger these logs go to slog.Default().
//
// A StepTimer learns every rank's own step time (what it did not spend
// waiting for its peers) with a tiny all-gather every few steps, and names
// the slowest rank and its factor over the median; DDP keeps one.
//
// Tensors are *tensor.Dense values of dtype float32, float64, int8, uint8,
// int32 or int64, or 16-bit floats (backed by []Float16 or []BFloat16, dtypes
// Float16Dtype and BFloat16Dtype), that are contiguous in memory (not strided
// views). Data moves straight out of and into tensor memory; collectives that
// change their input do so in place. Reductions of 16-bit floats are taken in
// float32 and rounded to 16 bits once (see ReduceOp).
package comm
