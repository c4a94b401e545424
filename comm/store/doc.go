// Package store holds the key-value stores that ranks rendezvous through, with
// the semantics of PyTorch's c10d stores. Ranks use a store to find each other
// before any collective runs: rank 0 publishes its address, every rank counts
// itself in with Add, and they Wait for each other's keys.
//
// Four kinds implement the Store interface:
//
//   - TCP: a server holds the keys in memory and clients reach it over TCP.
//     NewTCP(ctx, addr, isServer) is c10d's TCPStore: rank 0 passes
//     isServer=true and embeds the server (it lives until that store's
//     Close), the others dial it. NewServer/Serve run a server on its own
//     (as `tandem store` does) and Dial connects a client. Use it across
//     machines.
//   - File: NewFile(path) shares one file between processes on one machine
//     (or a shared file system with working flock), c10d's FileStore.
//   - Memory: NewMemory() for ranks that are goroutines of one process,
//     c10d's HashStore.
//   - Prefix: NewPrefix(prefix, s) puts every key under "prefix/" in s, so
//     that several groups share one store without collisions.
//
// # Semantics
//
// Values are opaque bytes; the caller owns what it passes and what it gets.
// Get, MultiGet and Wait block until their keys exist. Add keeps a counter as
// decimal text (a missing key counts as 0; a value that is not an integer is
// refused with ErrInvalidArgument). CompareSet(key, expected, desired) sets
// desired if the current value equals expected, or if the key is absent and
// expected is empty, and returns the value afterwards (expected when the key
// is absent and expected is not empty). DeleteKey does not wake waiters.
// NumKeys counts every key of the store (through a Prefix store too).
//
// # Timeouts and errors
//
// Every call takes a context. A blocking call gives up at the context's
// deadline or after the store's timeout (WithTimeout, default
// DefaultTimeout; Wait may name its own), whichever comes first, with an
// error wrapping ErrTimeout (and context.DeadlineExceeded when the context's
// deadline was the bound). A cancelled context yields an error wrapping
// context.Canceled, and not ErrTimeout; a nil context is refused with
// ErrInvalidArgument. Calls after Close, and calls blocked when Close ran,
// return ErrClosed. Test errors with errors.Is.
//
// # TCP store protocol
//
// One connection per client carries length-prefixed binary frames with
// request ids, so any number of goroutines share it. It opens with a
// handshake in which client and server each prove that they hold the shared
// token (WithToken, default $TANDEM_TOKEN) by a challenge-response with fresh
// nonces on both sides (internal/tokenauth): the token never crosses the
// wire, and a recorded handshake does not open another connection. A wrong
// or missing token is refused with ErrUnauthorized on both sides and logged
// by the server; a server without a token accepts every client, but a
// client with a token refuses such a server, which cannot prove it is the
// job's. A client and a server of different store protocol versions refuse
// each other with a message naming the versions. The server parks
// blocked requests on per-key waiter lists (no goroutine or polling per
// waiting request) and answers them when the keys appear or their timeout
// ends. A peer that sends a malformed, truncated or oversized frame
// (WithMaxFrame, WithMaxValue; 64 MiB by default) is disconnected with a
// logged reason while everyone else is served on. Until its proof is
// checked, a connection gets a 512-byte buffer and 5 seconds; at most 256
// connections (64 from one remote host, WithMaxPending) may be in that state
// at once, others are closed at once and their clients dial again, and the
// warnings about such connections are rate-limited, so that a flood of
// connections neither grows the server's memory nor floods its log. A client whose connection
// breaks reconnects and sends its in-flight requests again; writes are
// applied at most once thanks to a per-client session the server remembers
// (see TCPStore for the exact guarantees).
//
// # Observing
//
// A TCP store client keeps no counters of its own. WithObserver hands it an
// Observer that it tells of every operation it completes: the operation's
// name, its duration (reconnects included) and its error. Package metrics
// implements one that serves them as Prometheus metrics; this package does
// not depend on it.
package store
