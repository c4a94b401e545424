// Package rref holds remote references (RRefs) built on package rpc: a value
// lives on one worker, its owner, and other workers hold references to it,
// pass them around as RPC arguments and results, fetch copies (ToHere) or
// run methods on the value where it lives (Call). It follows the protocol
// of PyTorch's RRef and RRefContext.
//
//	ref, err := rref.Remote[*Stage](ctx, agent, "worker1", "stage.new", cfg) // returns at once
//	out, err := rref.Call[*tensor.Dense](ctx, ref, "Forward", x)             // runs on worker1
//	st, err := ref.ToHere(ctx)                                               // a copy, here
//	err = ref.Release(ctx)                                                   // the owner may delete it
//
// # Protocol
//
// Every reference has an id; every user holds a fork of it, with a fork id
// of its own, registered with the owner. Remote creates the value and the
// caller's fork together; LocalRRef makes an owner reference that forks
// when sent. Sending a reference forks it for the receiver: a fork sent by
// the owner is registered before it leaves; a fork sent by a user stays
// pending on the sender (keeping the sender's own reference, and so the
// value, alive) until the receiver has had the owner confirm it. The owner
// deletes a value once every fork is released. Message order does not
// matter: a release that overtakes a registration is remembered.
//
// # Releasing
//
// Go has no destructors: call Release when done with a user reference. A
// reference whose handle is garbage collected unreleased is released by a
// runtime cleanup as a safety net. At rpc.Agent.Shutdown or Close, user
// references still unreleased are leaks: Shutdown and Close return an error
// wrapping ErrLeaked that names them (and log it), and Shutdown, graceful,
// releases them so the owners free their values.
//
// # Failures
//
// ToHere and Call on a reference whose owner died fail with rpc.ErrPeerLost;
// an owner that does not answer makes them fail with rpc.ErrTimeout when the
// call's timeout (rpc.WithTimeout, else the agent's default) or the
// context's deadline passes. The creating function's error comes back from
// ToHere.
//
// # Installing
//
// An agent serves the protocol only when asked: start every worker that
// creates, owns, sends or receives references with
//
//	agent, err := rpc.InitFromEnv(ctx, "worker1", rpc.WithRegistry(reg),
//		rpc.WithExtensions(rref.Extension()))
//
// Linking the package in installs nothing; on an agent started without it,
// this package's functions fail with rpc.ErrInvalidArgument saying so.
//
// # Errors
//
// Remote, ToHere and Call return *rpc.CallError (Op "remote", "to_here",
// "call") naming the owner and the function or method, wrapping the cause:
// errors.Is matches rpc.ErrPeerLost, rpc.ErrTimeout, rpc.ErrRemote, and
// the context's errors through it.
package rref
