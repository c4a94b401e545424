// Package elastic keeps data-parallel training going while members of the
// job fail, stall or arrive, without restarting the processes that are
// still healthy: the survivors notice a lost peer within about a second,
// agree on the new membership, rebuild their process group, drop the step
// that was in flight on every member alike, and go on from the last
// committed step with the data re-sharded; a newcomer (or a restarted
// process) is healed by a state transfer from a live member, not by a
// checkpoint.
//
// # The pieces
//
// A job's members meet in a store that outlives any one of them: a
// standalone `tandem store` (or any comm/store.Store every member reaches).
// No training process serves it, so no training process is a single point
// of failure; the store itself is one (it is not replicated), and a job
// whose store dies stops with store errors.
//
// Manager.Quorum forms rounds. A round is a numbered membership agreed in
// the store: members take slots, and the round closes when everyone
// expected has arrived (the previous round's size plus the newcomers that
// announced themselves), or MaxSize members, or MinSize members once
// Config.LastCall has passed. The members are ranked so that rank 0 holds
// the most committed progress, a process group is built for them
// (comm.Init over a fresh prefix of the store, heartbeats every third of
// Config.PeerTimeout), and when any member is behind or new, rank 0's State
// and Progress are broadcast and loaded where they are missing.
//
// Manager.Commit ends every step with one small all-reduce, a vote: the step
// counts only if every member's step succeeded, and the vote also carries
// how many newcomers wait, so that every member reconfigures at the same
// step boundary. A member that cannot complete the vote discards the step;
// if another member did commit it, the next round heals the one behind, so
// no committed step is ever lost and members never diverge.
//
// # Batch size and learning rate
//
// When the world's size changes, Config.Batch says what happens:
// FixedGlobalBatch keeps the global batch (and the optimization, step for
// step: a run with any membership history ends with the model of an
// undisturbed run, to float tolerance), PerRankBatch keeps each member's
// batch and optionally scales the learning rate with the world's size
// (Round.LRScale). Stream visits the data as an endless sequence of epochs
// so that a step consumes the next global batch wherever the previous size
// left off; Manager.Indices gives each member its share.
//
// # Detection
//
// A killed member's peers see its sockets close at once; a stopped member
// or a cut link is noticed when a peer hears nothing from it for
// Config.PeerTimeout (default 1 s) inside a collective; then a round forms
// within Config.LastCall (default 500 ms). On this project's 2-core test
// machine a kill -9 costs about 0.3 s from the kill to the resumed
// training, a SIGSTOP about 1.3 s (TestProcessFaults); with the members on
// separate hosts (network namespaces, TestNetnsFaults) a link cut costs
// about 1.5 s.
//
// A member the others went on without (its link was down for seconds, or
// it was stopped and continued) finds, when it comes back, that newer
// rounds were formed without it: it then rejoins as a newcomer does,
// announcing itself so that the running members make room at their next
// commit, and is healed there.
//
// # What it does not do
//
// It does not restart processes (a launcher or the user does: `tandem run
// -nnodes MIN:MAX` restarts a failed node's workers), nor replicate the
// store, nor checkpoint (a job that loses every member starts again from
// its checkpoint, as without this package). Members of one round run one
// replica each; there is no sharding of a replica over several processes.
package elastic
