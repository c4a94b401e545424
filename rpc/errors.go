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

// RemoteError is the error a caller gets when the callee reports a failure:
// the function returned an error or panicked, the function is unknown, or the
// argument had the wrong type. It matches (errors.Is) the sentinels that fit
// the failure: ErrRemote (and ErrPanic) for a failing function,
// ErrUnknownFunction or ErrWrongType (both with ErrInvalidArgument), plus any
// shared sentinel that the remote error wrapped.
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
		what = "panicked"
	case codeUnknownFunction, codeWrongType, codeMalformed, codeTooLarge:
		what = "refused the call"
	case codeShuttingDown:
		what = "is shutting down"
	default:
		what = "failed"
	}
	return fmt.Sprintf("rpc: %s on worker %q %s: %s", e.Function, e.Worker, what, e.Message)
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
