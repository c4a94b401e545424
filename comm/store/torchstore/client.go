package torchstore

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/errs"
)

// Client is a store.Store that talks to a TCPStore server over torch 1.13's
// protocol: a PyTorch master (torch.distributed.TCPStore(..., is_master=True),
// torchrun's agent store) or a Server of this package.
//
// The protocol has no request ids, so a connection carries one call at a
// time. The client keeps a few idle connections and opens another when every
// one is busy: calls from many goroutines run at once, and a blocked Get or
// Wait holds up no other call (torch's own client serialises them all on one
// connection).
//
// A call whose context ends or whose timeout expires while the server may
// still answer (a WAIT or GET in flight, above all) closes its connection
// instead of returning it to the pool, so that a late reply can never be
// read as the answer to a later call; the next call opens a fresh one.
// Calls that only read (Get, Wait, Check, NumKeys, MultiGet) are tried once
// more on a new connection when theirs breaks, and so are Set and MultiSet
// when the broken connection was an idle one taken from the pool (the server
// may have restarted since); Add, CompareSet and DeleteKey are never
// repeated, since the first attempt may have been applied.
//
// Set and MultiSet have no reply in the protocol; the client follows them
// with a CHECK of no keys on the same connection, so that they return only
// once the server has applied them.
type Client struct {
	cfg  config
	addr string
	lim  limits

	// gone ends at Close, cutting short dials in progress.
	gone    context.Context
	goneNow context.CancelFunc

	mu     sync.Mutex
	idle   []*clientConn
	busy   map[*clientConn]struct{}
	closed bool
}

var _ store.Store = (*Client)(nil)

type clientConn struct {
	c      net.Conn
	r      *bufio.Reader
	reused bool // taken from the pool rather than dialled for this call
}

// Dial connects to the TCPStore server at addr (host:port), retrying while it
// is not up yet, for as long as ctx and the client's timeout allow, as torch
// clients do. Options: WithTimeout, WithKeyPrefix, WithMaxValue, CountIn,
// WithLogger. With CountIn it adds 1 to InitKey once connected.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	cfg := newConfig(opts)
	cl := &Client{cfg: cfg, addr: addr, lim: limits{maxValue: cfg.maxValue}, busy: map[*clientConn]struct{}{}}
	cl.gone, cl.goneNow = context.WithCancel(context.Background())
	err := cl.call(ctx, "dial", 0, noRetry, func(cc *clientConn) error {
		if !cfg.countIn {
			return nil
		}
		_, err := cl.add(cc, InitKey, 1)
		return err
	})
	if err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// Addr returns the server address the client dials.
func (cl *Client) Addr() string { return cl.addr }

// Close closes every connection of the client. Calls in progress fail with
// an error wrapping store.ErrClosed, and so do later ones. The server's keys
// stay.
func (cl *Client) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil
	}
	cl.closed = true
	cl.goneNow()
	for _, cc := range cl.idle {
		cc.c.Close()
	}
	cl.idle = nil
	for cc := range cl.busy {
		cc.c.Close()
	}
	return nil
}

func (cl *Client) isClosed() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.closed
}

func (cl *Client) key(k string) string { return cl.cfg.prefix + k }

func (cl *Client) keys(ks []string) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = cl.cfg.prefix + k
	}
	return out
}

// deadline returns when a call that starts now must give up: after timeout
// (the client's when not positive), or at ctx's deadline when that comes
// first (then ctxBound is true).
func (cl *Client) deadline(ctx context.Context, timeout time.Duration) (d time.Time, ctxBound bool, bound time.Duration) {
	if timeout <= 0 {
		timeout = cl.cfg.timeout
	}
	d = time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && !cd.After(d) {
		return cd, true, timeout
	}
	return d, false, timeout
}

// longAgo is a deadline in the past: setting it makes blocked I/O return.
var longAgo = time.Unix(1, 0)

// retryPolicy says whether a call may be repeated on a fresh connection
// when its own broke (never when it timed out or was cancelled).
type retryPolicy int

const (
	// noRetry: the first attempt may have been applied (Add, CompareSet,
	// DeleteKey).
	noRetry retryPolicy = iota
	// retryPooled: repeat only when the broken connection came from the
	// pool, where it may have died with a server that restarted (Set,
	// MultiSet: repeating them writes the same values again).
	retryPooled
	// retryAlways: the call only reads (Get, Wait, Check, NumKeys, MultiGet).
	retryAlways
)

// call runs fn on a connection, under a deadline of timeout (the client's
// when not positive) or ctx's, whichever comes first, and repeats it once
// as policy allows. It maps failures to the store's sentinels.
func (cl *Client) call(ctx context.Context, op string, timeout time.Duration, policy retryPolicy, fn func(*clientConn) error) error {
	return cl.run(ctx, op, timeout, policy, true, fn)
}

// callOnce runs fn like call, but dials at most once and never repeats it:
// for looking around after a failure, when the server may be gone.
func (cl *Client) callOnce(ctx context.Context, op string, fn func(*clientConn) error) error {
	return cl.run(ctx, op, 0, noRetry, false, fn)
}

func (cl *Client) run(ctx context.Context, op string, timeout time.Duration, policy retryPolicy, persist bool, fn func(*clientConn) error) error {
	if cl.isClosed() {
		return fmt.Errorf("torchstore %s: %w", op, store.ErrClosed)
	}
	if err := errs.CheckContext(ctx, "torchstore", op); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctxError(ctx, op)
	}
	d, ctxBound, bound := cl.deadline(ctx, timeout)
	for attempt := 0; ; attempt++ {
		cc, err := cl.acquire(ctx, op, d, ctxBound, persist)
		if err != nil {
			return err
		}
		cc.c.SetDeadline(d)
		stop := context.AfterFunc(ctx, func() { cc.c.SetDeadline(longAgo) })
		err = fn(cc)
		clean := stop()
		if err == nil && clean {
			cl.release(cc)
			return nil
		}
		cl.discard(cc)
		if err == nil {
			// The context ended as the call finished: its answer is good,
			// only the connection's deadline was disturbed.
			return nil
		}
		var pe *protoError
		switch {
		case cl.isClosed():
			return fmt.Errorf("torchstore %s: %w", op, store.ErrClosed)
		case ctx.Err() != nil:
			return ctxError(ctx, op)
		case errors.As(err, &pe):
			return fmt.Errorf("torchstore %s: %w", op, pe.err)
		case isTimeout(err):
			if ctxBound {
				return errs.Expired("torchstore: " + op)
			}
			return fmt.Errorf("torchstore: %s: no answer from %s within %v; if it waits for keys, check that "+
				"the rank that sets them is alive, or raise the timeout: %w", op, cl.addr, bound.Round(time.Millisecond), store.ErrTimeout)
		case attempt == 0 && (policy == retryAlways || (policy == retryPooled && cc.reused)):
			cl.cfg.logger.Debug("torchstore: connection broke; trying once more on a new one", "op", op, "addr", cl.addr, "err", err)
			continue
		}
		return fmt.Errorf("torchstore %s: the connection to %s broke: %w: %w", op, cl.addr, err, store.ErrPeerLost)
	}
}

// protoError is a failure that is not the connection's: the server answered
// something this client cannot take. Its err is what the caller gets.
type protoError struct{ err error }

func (e *protoError) Error() string { return e.err.Error() }

// ctxError reports a call that gave up because ctx ended.
func ctxError(ctx context.Context, op string) error {
	return errs.FromContext(ctx, "torchstore: "+op)
}

// acquire returns an idle connection, or dials a new one, retrying until d
// while the server refuses (when persist is set).
func (cl *Client) acquire(ctx context.Context, op string, d time.Time, ctxBound, persist bool) (*clientConn, error) {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		return nil, fmt.Errorf("torchstore %s: %w", op, store.ErrClosed)
	}
	if n := len(cl.idle); n > 0 {
		cc := cl.idle[n-1]
		cl.idle = cl.idle[:n-1]
		cl.busy[cc] = struct{}{}
		cl.mu.Unlock()
		cc.reused = true
		return cc, nil
	}
	cl.mu.Unlock()
	dctx, cancel := context.WithDeadline(ctx, d)
	defer cancel()
	defer context.AfterFunc(cl.gone, cancel)()
	backoff := 10 * time.Millisecond
	var last error
	for {
		var dialer net.Dialer
		c, err := dialer.DialContext(dctx, "tcp", cl.addr)
		if err == nil {
			cc := &clientConn{c: c, r: bufio.NewReaderSize(c, 4<<10)}
			cl.mu.Lock()
			if cl.closed {
				cl.mu.Unlock()
				c.Close()
				return nil, fmt.Errorf("torchstore %s: %w", op, store.ErrClosed)
			}
			cl.busy[cc] = struct{}{}
			cl.mu.Unlock()
			return cc, nil
		}
		if last == nil || dctx.Err() == nil {
			last = err
		}
		if !persist {
			return nil, fmt.Errorf("torchstore %s: could not reach the TCPStore server at %s: %w: %w",
				op, cl.addr, err, store.ErrPeerLost)
		}
		select {
		case <-dctx.Done():
		case <-time.After(backoff):
			backoff = min(backoff*2, time.Second)
			continue
		}
		if cl.isClosed() {
			return nil, fmt.Errorf("torchstore %s: %w", op, store.ErrClosed)
		}
		if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return nil, ctxError(ctx, op)
		}
		what := fmt.Sprintf("torchstore: %s: could not reach the TCPStore server at %s", op, cl.addr)
		if ctxBound {
			return nil, fmt.Errorf("%w: %w: %w", errs.Expired(what), last, store.ErrPeerLost)
		}
		return nil, fmt.Errorf("%s before the timeout; check the address and that the master (rank 0 or torchrun's agent) is up: %w: %w: %w",
			what, last, store.ErrTimeout, store.ErrPeerLost)
	}
}

// release returns a healthy connection to the pool.
func (cl *Client) release(cc *clientConn) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.busy, cc)
	if cl.closed || len(cl.idle) >= idlePool {
		cc.c.Close()
		return
	}
	cc.c.SetDeadline(time.Time{})
	cl.idle = append(cl.idle, cc)
}

// discard closes a connection that may be out of step with its server.
func (cl *Client) discard(cc *clientConn) {
	cl.mu.Lock()
	delete(cl.busy, cc)
	cl.mu.Unlock()
	cc.c.Close()
}

// Wire steps on one connection.

func (cc *clientConn) write(b []byte) error {
	_, err := cc.c.Write(b)
	return err
}

func (cc *clientConn) readByte() (byte, error) {
	b, err := cc.r.ReadByte()
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

func (cc *clientConn) readUint64() (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(cc.r, b[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (cl *Client) readValue(cc *clientConn) ([]byte, error) {
	v, err := readBytes(cc.r, cl.lim, "value")
	if errors.Is(err, errTooLarge) {
		return nil, &protoError{fmt.Errorf("the server sent %w (raise it with WithMaxValue): %w", err, store.ErrTooLarge)}
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return v, err
}

// wait sends WAIT for keys (already prefixed) and reads STOP_WAITING.
func (cl *Client) wait(cc *clientConn, keys []string) error {
	if err := cc.write(encodeQuery(query{typ: qWait, keys: keys})); err != nil {
		return err
	}
	b, err := cc.readByte()
	if err != nil {
		return err
	}
	if b != stopWaiting {
		return &protoError{fmt.Errorf("the server answered WAIT with %d, not STOP_WAITING (0); is %s a torch 1.13 TCPStore?", b, cl.addr)}
	}
	return nil
}

func (cl *Client) add(cc *clientConn, key string, delta int64) (int64, error) {
	if err := cc.write(encodeQuery(query{typ: qAdd, key: key, delta: delta})); err != nil {
		return 0, err
	}
	n, err := cc.readUint64()
	return int64(n), err
}

// confirm asks for a CHECK of no keys, whose READY proves that the queries
// sent before it on the connection were applied.
func (cl *Client) confirm(cc *clientConn) error {
	b, err := cc.readByte()
	if err != nil {
		return err
	}
	if b != checkReady {
		return &protoError{fmt.Errorf("the server answered CHECK of no keys with %d, not READY (0); is %s a torch 1.13 TCPStore?", b, cl.addr)}
	}
	return nil
}

var confirmQuery = encodeQuery(query{typ: qCheck})

func (cl *Client) checkSize(op string, what string, n int) error {
	if n > cl.cfg.maxValue {
		return fmt.Errorf("torchstore %s: %s of %d bytes exceeds the limit of %d; raise it with WithMaxValue "+
			"(on the server too): %w", op, what, n, cl.cfg.maxValue, store.ErrTooLarge)
	}
	return nil
}

// Set implements store.Store. It returns once the server has applied it.
func (cl *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := cl.checkSize("set", "value", len(value)); err != nil {
		return err
	}
	b := encodeQuery(query{typ: qSet, key: cl.key(key), value: value})
	b = append(b, confirmQuery...)
	return cl.call(ctx, "set", 0, retryPooled, func(cc *clientConn) error {
		if err := cc.write(b); err != nil {
			return err
		}
		return cl.confirm(cc)
	})
}

// Get implements store.Store: it waits for the key (WAIT), then reads it
// (GET), as torch's client does.
func (cl *Client) Get(ctx context.Context, key string) ([]byte, error) {
	k := cl.key(key)
	var v []byte
	err := cl.call(ctx, "get", 0, retryAlways, func(cc *clientConn) error {
		if err := cl.wait(cc, []string{k}); err != nil {
			return err
		}
		if err := cc.write(encodeQuery(query{typ: qGet, key: k})); err != nil {
			return err
		}
		var err error
		v, err = cl.readValue(cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%w (key %q)", err, key)
	}
	return v, nil
}

// Add implements store.Store. When the key holds something that is not an
// integer the server closes the connection (the protocol has no error
// reply); the client then reads the key and returns an error wrapping
// store.ErrInvalidArgument.
func (cl *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	err := cl.call(ctx, "add", 0, noRetry, func(cc *clientConn) (err error) {
		n, err = cl.add(cc, cl.key(key), delta)
		return err
	})
	if err != nil && errors.Is(err, store.ErrPeerLost) && !errors.Is(err, store.ErrTimeout) {
		if why := cl.diagnoseAdd(ctx, key, delta); why != nil {
			return 0, why
		}
	}
	return n, err
}

// diagnoseAdd looks at the key of an ADD whose connection the server
// closed, and explains the failure when the key is not a counter.
func (cl *Client) diagnoseAdd(ctx context.Context, key string, delta int64) error {
	k := cl.key(key)
	var v []byte
	var present bool
	err := cl.callOnce(ctx, "add", func(cc *clientConn) error {
		if err := cc.write(encodeQuery(query{typ: qCheck, keys: []string{k}})); err != nil {
			return err
		}
		b, err := cc.readByte()
		if err != nil || b != checkReady {
			return err
		}
		present = true
		if err := cc.write(encodeQuery(query{typ: qGet, key: k})); err != nil {
			return err
		}
		v, err = cl.readValue(cc)
		return err
	})
	if err != nil || !present {
		return nil
	}
	cur, ok := parseCounter(v)
	if ok && !((delta > 0 && cur > maxInt64-delta) || (delta < 0 && cur < minInt64-delta)) {
		return nil
	}
	return fmt.Errorf("torchstore add: key %q holds %q, not a decimal integer counter that can take %d; "+
		"the server closed the connection, as torch's does (the protocol has no error reply): %w",
		key, abbrev(v), delta, store.ErrInvalidArgument)
}

// CompareSet implements store.Store.
func (cl *Client) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	if err := cl.checkSize("compare-set", "value", len(expected)+len(desired)); err != nil {
		return nil, err
	}
	b := encodeQuery(query{typ: qCompareSet, key: cl.key(key), value: expected, desired: desired})
	var v []byte
	err := cl.call(ctx, "compare-set", 0, noRetry, func(cc *clientConn) (err error) {
		if err := cc.write(b); err != nil {
			return err
		}
		v, err = cl.readValue(cc)
		return err
	})
	return v, err
}

// DeleteKey implements store.Store. As in torch, deleting a key does not
// wake anyone waiting for it.
func (cl *Client) DeleteKey(ctx context.Context, key string) (bool, error) {
	var n uint64
	err := cl.call(ctx, "delete-key", 0, noRetry, func(cc *clientConn) (err error) {
		if err := cc.write(encodeQuery(query{typ: qDeleteKey, key: cl.key(key)})); err != nil {
			return err
		}
		n, err = cc.readUint64()
		return err
	})
	return n == 1, err
}

// NumKeys implements store.Store. It counts every key of the server,
// whatever its prefix, InitKey included.
func (cl *Client) NumKeys(ctx context.Context) (int64, error) {
	var n uint64
	err := cl.call(ctx, "num-keys", 0, retryAlways, func(cc *clientConn) (err error) {
		if err := cc.write(encodeQuery(query{typ: qNumKeys})); err != nil {
			return err
		}
		n, err = cc.readUint64()
		return err
	})
	return int64(n), err
}

// Check implements store.Store with the protocol's CHECK query (which torch
// 1.13's Python API does not expose, but its server answers).
func (cl *Client) Check(ctx context.Context, keys []string) (bool, error) {
	b := encodeQuery(query{typ: qCheck, keys: cl.keys(keys)})
	var ready bool
	err := cl.call(ctx, "check", 0, retryAlways, func(cc *clientConn) error {
		if err := cc.write(b); err != nil {
			return err
		}
		r, err := cc.readByte()
		if err != nil {
			return err
		}
		switch r {
		case checkReady:
			ready = true
		case checkNotReady:
		default:
			return &protoError{fmt.Errorf("the server answered CHECK with %d, not READY (0) or NOT_READY (1)", r)}
		}
		return nil
	})
	return ready, err
}

// Wait implements store.Store. A zero timeout means the client's (see
// WithTimeout). When it expires the connection, on which the server may
// still answer, is closed rather than reused.
func (cl *Client) Wait(ctx context.Context, keys []string, timeout time.Duration) error {
	ks := cl.keys(keys)
	err := cl.call(ctx, "wait", timeout, retryAlways, func(cc *clientConn) error { return cl.wait(cc, ks) })
	if err != nil {
		return fmt.Errorf("%w (keys %q)", err, keys)
	}
	return nil
}

// MultiSet implements store.Store as one SET per key, sent together, then
// confirmed. torch 1.13 has no MULTI_SET: another client may see some of the
// keys before the others.
func (cl *Client) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("torchstore multi-set got %d keys and %d values; pass one value per key: %w",
			len(keys), len(values), store.ErrInvalidArgument)
	}
	var b []byte
	for i, k := range keys {
		if err := cl.checkSize("multi-set", "value", len(values[i])); err != nil {
			return err
		}
		b = append(b, encodeQuery(query{typ: qSet, key: cl.key(k), value: values[i]})...)
	}
	b = append(b, confirmQuery...)
	return cl.call(ctx, "multi-set", 0, retryPooled, func(cc *clientConn) error {
		if err := cc.write(b); err != nil {
			return err
		}
		return cl.confirm(cc)
	})
}

// MultiGet implements store.Store as one WAIT for every key, then one GET
// per key. torch 1.13 has no MULTI_GET: a key deleted between the WAIT and
// its GET fails the call (the server closes the connection; it is tried once
// more).
func (cl *Client) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	ks := cl.keys(keys)
	var gets []byte
	for _, k := range ks {
		gets = append(gets, encodeQuery(query{typ: qGet, key: k})...)
	}
	var vs [][]byte
	err := cl.call(ctx, "multi-get", 0, retryAlways, func(cc *clientConn) error {
		if err := cl.wait(cc, ks); err != nil {
			return err
		}
		if len(ks) == 0 {
			vs = [][]byte{}
			return nil
		}
		if err := cc.write(gets); err != nil {
			return err
		}
		vs = make([][]byte, len(ks))
		for i := range ks {
			v, err := cl.readValue(cc)
			if err != nil {
				return err
			}
			vs[i] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (keys %q)", err, keys)
	}
	return vs, nil
}

// Append implements store.Store by refusing: torch 1.13's protocol has no
// APPEND query (torch 2.x added one), and COMPARE_SET cannot stand in for
// it, since its reply does not say whether it swapped (two clients
// appending the same bytes at once would both believe they had). The error
// wraps errors.ErrUnsupported and store.ErrInvalidArgument.
func (cl *Client) Append(ctx context.Context, key string, value []byte) error {
	if cl.isClosed() {
		return fmt.Errorf("torchstore append: %w", store.ErrClosed)
	}
	return fmt.Errorf("torchstore append (key %q): torch 1.13's TCPStore protocol has no APPEND query "+
		"(it came with torch 2.x) and COMPARE_SET cannot emulate it safely; store each piece under its own key, "+
		"or use a Tandem store (store.Dial): %w: %w", key, errors.ErrUnsupported, store.ErrInvalidArgument)
}
