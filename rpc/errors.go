package rpc

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/wire"
)

// Sentinel errors; test with errors.Is. The first group is shared with every
// layer of Tandem (comm.ErrTimeout and rpc.ErrTimeout are the same value).
var (
	ErrTimeout         = errs.Timeout
	ErrPeerLost        = errs.PeerLost
	ErrClosed          = errs.Closed
	ErrInvalidArgument = errs.InvalidArgument
	ErrUnauthorized    = errs.Unauthorized
	ErrTooLarge        = errs.TooLarge
	ErrMismatch        = errs.Mismatch
)

// RPC-specific sentinels.
var (
	// ErrRemote: the remote function returned an error or panicked. The
	// error's text carries the remote message.
	ErrRemote = errors.New("rpc: remote function failed")
	// ErrPanic: the remote function panicked (also matches ErrRemote). The
	// callee recovered and keeps serving.
	ErrPanic = errors.New("rpc: remote function panicked")
	// ErrUnknownFunction: the callee has no function registered under the
	// name called (also matches ErrInvalidArgument).
	ErrUnknownFunction = errors.New("rpc: unknown function")
	// ErrWrongType: an argument or a result does not have the type the other
	// side expects (also matches ErrInvalidArgument).
	ErrWrongType = wire.ErrWrongType
	// ErrMalformed: bytes on the wire do not form a valid message.
	ErrMalformed = wire.ErrMalformed
)

// errCode says which kind of failure an error frame reports.
type errCode uint8

const (
	codeRemote errCode = iota + 1
	codePanic
	codeUnknownFunction
	codeWrongType
	codeMalformed
	codeTooLarge
	codeShuttingDown
	codeTimeout
)

// sentinel bits carried with a remote error, so that a handler's error that
// wraps a shared sentinel still matches it at the caller.
var sentinelBits = []error{ErrTimeout, ErrPeerLost, ErrClosed, ErrInvalidArgument, ErrUnauthorized, ErrTooLarge, ErrMismatch, ErrWrongType, ErrUnknownFunction, ErrMalformed}

func sentinelMask(err error) uint64 {
	var m uint64
	for i, s := range sentinelBits {
		if errors.Is(err, s) {
			m |= 1 << i
		}
	}
	return m
}

// CallError is the error of a call that failed, in the manner of
// net.OpError: which operation, on which worker, of which function, and
// why. Sync, Async, Agent.Call and CallLocal return one (Op "call"), and so
// do the calls of packages built on rpc (rref.Remote: "remote",
// RRef.ToHere: "to_here"). Err is the cause, which Unwrap returns:
// errors.Is matches through it the sentinels the cause wraps (ErrTimeout,
// ErrPeerLost, ErrClosed, context.Canceled, context.DeadlineExceeded, …)
// and errors.As finds a *RemoteError, which carries what the callee
// reported.
type CallError struct {
	Op   string // the operation: "call", or "remote", "to_here", … for packages built on rpc
	Peer string // the name of the worker called
	Func string // the function called
	Err  error  // the cause
}

func (e *CallError) Error() string {
	var b strings.Builder
	b.WriteString("rpc: ")
	b.WriteString(e.Op)
	if e.Func != "" {
		fmt.Fprintf(&b, " %q", e.Func)
	}
	if e.Peer != "" {
		b.WriteString(" on worker ")
		b.WriteString(e.Peer)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *CallError) Unwrap() error { return e.Err }

// callError wraps err, the failure of a call of fn to peer, in a
// *CallError, unless it already is the error of that very call.
func callError(op, peer, fn string, err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := err.(*CallError); ok && ce.Op == op && ce.Peer == peer && ce.Func == fn {
		return err
	}
	return &CallError{Op: op, Peer: peer, Func: fn, Err: err}
}

// RemoteError is the error a caller gets when the callee reports a failure:
// the function returned an error or panicked, the function is unknown, or the
// argument had the wrong type. It matches (errors.Is) the sentinels that fit
// the failure: ErrRemote (and ErrPanic) for a failing function,
// ErrUnknownFunction or ErrWrongType (both with ErrInvalidArgument), plus any
// shared sentinel that the remote error wrapped. A call returns it wrapped
// in a *CallError, which names the worker and the function; its own text
// says what happened there and the callee's message.
type RemoteError struct {
	Worker   string // the callee's name
	Function string // the function called
	Message  string // the remote side's message (for a panic: value and trimmed stack)

	code      errCode
	sentinels []error
}

func (e *RemoteError) Error() string {
	var what string
	switch e.code {
	case codePanic:
		what = "the function panicked"
	case codeUnknownFunction, codeWrongType, codeMalformed, codeTooLarge:
		what = "the worker refused the call"
	case codeShuttingDown:
		what = "the worker is shutting down"
	case codeTimeout:
		what = "the function ran out of time"
	default:
		what = "the function failed"
	}
	return what + ": " + e.Message
}

// Unwrap returns the sentinels the error matches.
func (e *RemoteError) Unwrap() []error { return e.sentinels }

func newRemoteError(worker, fn string, code errCode, mask uint64, msg string) *RemoteError {
	e := &RemoteError{Worker: worker, Function: fn, Message: msg, code: code}
	switch code {
	case codeRemote:
		e.sentinels = append(e.sentinels, ErrRemote)
	case codePanic:
		e.sentinels = append(e.sentinels, ErrRemote, ErrPanic)
	case codeUnknownFunction:
		e.sentinels = append(e.sentinels, ErrUnknownFunction, ErrInvalidArgument)
	case codeWrongType:
		e.sentinels = append(e.sentinels, ErrWrongType, ErrInvalidArgument)
	case codeMalformed:
		e.sentinels = append(e.sentinels, ErrMalformed, ErrInvalidArgument)
	case codeTooLarge:
		e.sentinels = append(e.sentinels, ErrTooLarge)
	case codeShuttingDown:
		e.sentinels = append(e.sentinels, ErrPeerLost, ErrClosed)
	case codeTimeout:
		e.sentinels = append(e.sentinels, ErrTimeout)
	default:
		e.sentinels = append(e.sentinels, ErrRemote)
	}
	for i, s := range sentinelBits {
		if mask&(1<<i) != 0 && !containsErr(e.sentinels, s) {
			e.sentinels = append(e.sentinels, s)
		}
	}
	return e
}

func containsErr(list []error, e error) bool {
	for _, x := range list {
		if x == e {
			return true
		}
	}
	return false
}

// handlerError is how the server side classifies a failure before it is
// sent back as an error frame.
type handlerError struct {
	code errCode
	msg  string
	err  error // the original error, for sentinel bits
}

func (e *handlerError) Error() string { return e.msg }
func (e *handlerError) Unwrap() error { return e.err }

func wrongTypef(format string, args ...any) error {
	return &handlerError{code: codeWrongType, msg: fmt.Sprintf(format, args...), err: ErrWrongType}
}

// classify turns whatever a handler produced into the code and mask sent back.
func classify(err error) (errCode, uint64, string) {
	var he *handlerError
	if errors.As(err, &he) {
		mask := uint64(0)
		if he.err != nil {
			mask = sentinelMask(he.err)
		}
		return he.code, mask, he.msg
	}
	var re *RemoteError
	if errors.As(err, &re) {
		// A nested call failed: pass its kind along so a chain of calls keeps
		// the original classification.
		return codeRemote, sentinelMask(err), err.Error()
	}
	return codeRemote, sentinelMask(err), err.Error()
}

// suggest returns the registered names closest to name (edit distance at most
// 2, or sharing a prefix), for "did you mean" messages.
func suggest(name string, names []string) []string {
	var out []string
	for _, n := range names {
		if editDistance(strings.ToLower(n), strings.ToLower(name)) <= 2 ||
			(len(name) >= 3 && (strings.HasPrefix(n, name) || strings.HasPrefix(name, n))) {
			out = append(out, n)
		}
	}
	return out
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
