// Package shm is a shared-memory transport.Transport for ranks that all run
// on one host: no sockets and no system calls on the data path.
//
// # Connecting
//
// Rank 0 creates one segment file for the world in /dev/shm (a random name,
// mode 0600, so only this user can map it) and publishes its name through
// the job's rendezvous store, which is token-authenticated; the segment's
// header carries a hash of transport.Config.Token, which every rank checks.
// Every rank maps the file with mmap, and once all have, each removes its
// name (only a file whose header and token hash check out), so the memory is freed when the last rank unmaps it and nothing is
// left behind by a job that crashes after connecting.
//
// # Data path
//
// Every ordered pair of ranks has a ring in the segment (4 MiB each for small
// worlds, less for large ones; WithRingBytes): a single-producer
// single-consumer byte stream whose producer-written head and
// consumer-written tail are 64-bit words on their own cache lines, accessed
// only through sync/atomic. A message is a 64-byte frame header (tag,
// length) followed by its payload; the sender copies it in pieces of up to
// 128 KiB and publishes each piece by advancing the head, so the receiver
// copies one piece out while the next goes in, and messages of any size
// stream through a ring of fixed size. A reader goroutine per peer takes the
// frames off in order and copies each straight into the receive posted for
// its tag, or into a buffer that a later receive takes, so tags are matched
// as in comm/tcp.
//
// # Waiting
//
// A side that finds the ring empty (the reader) or full (the sender) polls
// it for up to 50 µs (WithSpin), yielding the processor to its process's
// other goroutines and to the other threads on its CPU between looks
// (futex.Yield), then sleeps on a futex word in the
// segment: it announces itself in a flag word, and the other side makes
// the futex wake system call only when that flag is set, so a busy stream
// costs no system calls. A futex costs no CPU while idle, where a sleep
// back-off would either add latency or burn CPU; but its wake-up takes
// tens of microseconds on a virtual machine, which the poll saves in the
// common case of a peer that answers within microseconds. Ranks that
// outnumber the CPUs poll too: a poll gives its CPU away at every look, so
// it does not hold the CPU that the awaited rank needs. Sleeps last at most
// 10 ms: every wake-up checks the context, this rank's own state and the
// peer's.
//
// # Failures
//
// Each rank's block in the segment holds its state (attached, closed,
// aborted, with the abort's cause), its process id and a heartbeat word it
// updates every 100 ms, whatever the peer timeout, so that ranks configured
// with different timeouts still judge each other correctly. A wait fails with
// ErrPeerLost when the peer aborted, closed (once everything it sent has been
// received), exited (its process id is gone) or stopped beating for the peer
// timeout (transport.Config.PeerTimeout, 5 s by default). Abort and Close
// wake every sleeper on this rank's rings, here and in the peers. A send
// whose context ends after part of its message was published cannot take it
// back: the link is then marked broken and the peer's receives fail.
//
// The backend registers itself with comm as "shm". It runs on Linux only.
package shm
