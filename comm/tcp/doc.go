// Package tcp is Tandem's TCP backend: a transport.Transport that connects the
// ranks of one world in a full mesh of TCP connections, set up through the
// rendezvous store.
//
// # Using it
//
// Most programs never touch this package: comm.InitFromEnv uses it as the
// default backend (comm imports it directly, so no blank import is needed).
// To build a transport by hand:
//
//	tr, err := tcp.Backend{}.Connect(ctx, transport.Config{
//		Rank: rank, Size: world, Store: st, Token: os.Getenv("TANDEM_TOKEN"),
//	})
//	defer tr.Close()
//	err = tr.Send(ctx, 1, tag, buf)
//
// This package depends only on comm/transport and comm/store, never on comm,
// which is what lets comm use it as its built-in default while other backends
// register themselves by name.
//
// # Connection set-up
//
// Every rank listens on a free port and publishes its address under
// "tcp/addr/<rank>" in the store; rank 0 publishes a random per-run nonce
// under "tcp/nonce". Each rank then dials every lower rank and accepts a
// connection from every higher rank. The dialer opens with a hello carrying its
// rank, the world size, the run nonce and a fresh nonce; the acceptor
// challenges it with a fresh nonce of its own; the dialer proves that it
// holds the shared token with an HMAC-SHA256 over both records, and the
// acceptor answers with a reply that proves the same over all three
// (internal/tokenauth: the token itself never crosses the wire, and a
// recorded handshake does not open another connection). A wrong token is
// refused with ErrUnauthorized on both sides, a different world size with
// ErrMismatch naming both sizes, a rank of another protocol version with
// ErrMismatch naming both versions.
// The listener lives only until every higher rank has connected. While it
// lives, at most 256 connections (64 from one remote host) may be in their
// handshake at once, each for at most 5 seconds; others are closed at once
// and a rank among them dials again, so a flood of connections to the port
// costs the rank a bounded amount of memory.
//
// # Wire format and data path
//
// Each message is a 24-byte header (kind, tag, length) followed by the payload,
// written with one writev call (net.Buffers) so the payload is never copied in
// user space. One reader goroutine per connection demultiplexes frames into
// per-(peer, tag) queues: when a Recv is already waiting for the message, the
// payload is read from the socket straight into the caller's buffer. A large
// payload (32 KiB or more) whose Recv is not posted yet stays in the socket
// for up to a millisecond, since collectives post the Recv a moment later;
// then, or for small messages at once, it is read into a pooled buffer and
// copied when the Recv comes (a Recv posted while the payload streams in
// takes over the rest directly). The wait is bounded so that receiving
// messages in another order than they were sent costs time, never a
// deadlock. Send and Recv allocate nothing per message (a Send under a
// cancellable context registers one context.AfterFunc). Messages above the
// size limit (transport.Config.MaxMessage, default DefaultMaxMessage) are
// refused with ErrTooLarge.
//
// # Ranks on one machine
//
// Between two processes of one machine a large message (256 KiB or more)
// need not go through the socket at all: the sender writes a small reference
// frame (length, address, id), the receiver copies the payload straight out
// of the sender's memory into the receive buffer with process_vm_readv(2) and
// acknowledges, and Send returns on the acknowledgement. That is one copy
// instead of two and none of the protocol's per-packet work, which roughly
// halves the processor time of moving bulk data between local ranks, the
// cost that bounds collectives when several ranks share a few cores. Right
// after the handshake, both sides of every connection probe whether this
// works: each proves to the other, through an abstract Unix socket, which
// process it is, so that the process read is the one the kernel names
// (SO_PEERCRED) and never one the peer names, and only if it runs as the
// same user; then each reads a random token from the other's memory. The
// path is used exactly where the kernel allows it (same machine, network
// and PID namespace, same user, ptrace access permitted); elsewhere
// messages travel through the socket. Note that Yama (kernel.yama.ptrace_scope of 1 or more, the
// default on Ubuntu) forbids such reads between sibling processes, so ranks
// started side by side by one launcher fall back to the socket there unless
// the administrator sets the scope to 0. WithSameHostCopy(false) turns the
// mechanism off. The copy runs in the
// goroutine of the Recv that takes the message, never in the reader; a
// reference whose Recv does not come within a millisecond is copied into a
// buffer by the reader, so a Send never waits for a Recv indefinitely.
//
// # Failure
//
// When a connection ends (EOF, reset, a peer's Abort or Close), every pending
// and future operation with that peer fails with an error wrapping
// ErrPeerLost; messages that had fully arrived before can still be received.
// Abort sends an abort frame to every peer and fails local operations with
// the given cause. Every operation honours its context: an expired context
// yields an error wrapping both ErrTimeout and context.DeadlineExceeded, a
// cancelled one an error wrapping context.Canceled (and not ErrTimeout); a
// nil context is refused with ErrInvalidArgument.
// Close ends every goroutine and socket the transport started.
//
// # Liveness
//
// A peer can also stop answering without closing anything: a process
// stopped with SIGSTOP or by a debugger, swapped out, stuck in the kernel,
// or a link that drops every packet. Every connection therefore proves its
// peer alive. When nothing else has gone out on a connection for about a
// second, its watcher sends a heartbeat frame (a bare header; it is skipped
// while a write holds the line, since that write proves the rank alive, and
// it never delays a message). Every byte read from the peer, a heartbeat or
// part of a payload still streaming in, counts as a sign of life. A peer
// from which nothing at all has come for the peer timeout (DefaultPeerTimeout,
// 5 s; WithPeerTimeout or transport.Config.PeerTimeout) is failed: pending
// and later operations with it fail with an error wrapping ErrPeerLost that
// says it is unresponsive and since when ("rank 1 is unresponsive: nothing
// received for 5s (since 14:02:11.532) ..."), and the connection is cut.
// Heartbeats are what catch a stopped process, since its kernel still
// acknowledges every segment; TCP_USER_TIMEOUT, set on every connection to
// the same timeout, makes the kernel give up on data the peer's machine
// never acknowledges (a cut link), so that a write blocked on a full socket
// fails too. A heartbeat carries the interval at which its sender wants to
// hear from the receiver, so ranks configured with different timeouts keep
// each other's checks satisfied. A negative peer timeout turns the check
// off (heartbeats still go out for peers that check). On links that lose
// packets heavily or stall for seconds, raise the timeout: a retransmission
// that takes longer than it reads as a dead peer.
package tcp
