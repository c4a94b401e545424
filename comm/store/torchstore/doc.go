// Package torchstore speaks the wire protocol of PyTorch's c10d TCPStore, so
// that Tandem processes and PyTorch processes share one rendezvous store:
// a Tandem worker started by torchrun joins the agent's store with Dial, and
// a Server serves PyTorch clients (torch.distributed.TCPStore(host, port,
// world_size, is_master=False)) when asked to.
//
// Client implements store.Store; comm, rpc and the rest use it as any other
// store. Server is a store too, but reached only through clients.
//
// # Which torch
//
// The protocol is the one of torch 1.13, and it is tested here against
// Debian's python3-torch 1.13: a Go client of a Python master, Python
// clients of a Go server together with Go clients, and Go workers started by
// torchrun that meet in its agent's store (under the key prefix
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" that torch's own workers
// use there; store.NewPrefix over a Client reproduces it). In that version:
//
//   - A request is one query-type byte, then its arguments: strings and byte
//     strings as a little-endian uint64 length and the bytes, integers as
//     little-endian int64, key lists (CHECK, WAIT) as a uint64 count and the
//     keys. The types are SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4,
//     WAIT 5, GETNUMKEYS 6, WATCH_KEY 7 and DELETE_KEY 8. There is no hello,
//     version, token or request id; SET has no reply, and a request the
//     server cannot serve (GET of a missing key, ADD to a value that is no
//     integer) makes it close the connection.
//   - GET does not block: clients send WAIT, read STOP_WAITING, then GET.
//     A client whose wait times out (torch raises "Socket Timeout") leaves
//     the WAIT parked on the server, which answers it when the keys appear;
//     torch's client then reads that late STOP_WAITING as the answer to its
//     next query. This package's client closes such a connection instead.
//   - torch's API puts "/" before every key (DefaultKeyPrefix); clients
//     built with a world size add 1 to the raw key "init/" (InitKey; see
//     CountIn), and a master built so waits for the count to reach it.
//   - Every torch client opens a second connection that stays silent unless
//     its C++ watchKey is used (WATCH_KEY; the Python API does not offer it).
//     The server answers WATCH_KEY as torch 1.13's does (a registration
//     reply, then a notification per change of the key), checked here by Go
//     tests that read the bytes, not by a torch client.
//   - torch 1.13 has no APPEND, MULTI_GET or MULTI_SET. The client builds
//     MultiSet from SETs and MultiGet from one WAIT and GETs (neither is
//     atomic), and Append returns an error wrapping errors.ErrUnsupported and
//     store.ErrInvalidArgument: COMPARE_SET does not say whether it swapped,
//     so no safe append can be built from it.
//   - torch 1.13's server does not wake a waiting client when COMPARE_SET
//     creates the key it waits for (checked against Python): a Wait or Get
//     for a key that another client creates with CompareSet sleeps until its
//     timeout. Code that meets on such keys polls with Check instead, as
//     comm's rendezvous does on torchrun's agent store. This package's own
//     server wakes waiters on every write.
//
// Later versions of torch changed the protocol. As read in PyTorch's source,
// and neither tested here nor claimed to work: torch 2.x added APPEND,
// MULTI_GET, MULTI_SET and CANCEL_WAIT (with a WAIT_CANCELED reply) after the
// 1.13 types; later releases then put a VALIDATE query with a magic number
// (0x3C85F7CE) first, which renumbers every query type, dropped WATCH_KEY
// and the second connection, and added a libuv-based server (the default in
// recent releases) and further framing. A 2.x client that opens with
// VALIDATE is recognised by the server, refused, and the mismatch logged; a
// 2.x master may or may not answer this package's client.
//
// # Security
//
// The protocol carries no token: whoever reaches a server can read, change
// and delete every key, and so steer a job's rendezvous. Serving it is
// opt-in: NewServer refuses to start without the Unauthenticated option, and
// it listens on loopback unless it is given a host. Prefer Tandem's own
// store (store.NewServer), which proves a token, wherever no PyTorch process
// needs to join.
//
// The server bounds what a peer can cost it: open connections in all and per
// remote host (WithMaxConns; over the caps a connection is closed at once,
// with a rate-limited warning), the size of one key or value (WithMaxValue;
// memory is allocated as bytes arrive, not as lengths are announced), the
// time a query may take to arrive once it has started and a reply to be
// taken (WithQueryTimeout), the WAITs and watches one connection may park,
// and the replies it may leave unread. A connection that sends nothing is
// left open, since torch's second connection does exactly that; the
// connection caps bound them. The keys the clients store are not bounded,
// as in torch.
//
// # Timeouts and errors
//
// Every client call honours its context and the client's timeout
// (WithTimeout; Wait may name its own). A call that gives up fails with an
// error wrapping store.ErrTimeout (and context.DeadlineExceeded when the
// context's deadline was the bound); a cancelled context yields
// context.Canceled; calls during or after Close yield store.ErrClosed; a
// server that went away yields store.ErrPeerLost. A connection whose call
// ended before its reply came is closed, never reused (see Client).
package torchstore
