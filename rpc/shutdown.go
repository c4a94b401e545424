package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Shutdown stops the agent.
//
// Graceful (graceful true, what a program normally does at its end): every
// worker waits until the work of the whole group is done, then all stop. The
// workers run rounds through the store: in each, a worker waits until it has
// no call in flight, no request being served and no held work, then
// publishes how many requests it has sent and received so far, and reads
// everyone's numbers. The group is done at the first round in which every
// worker's numbers equal its numbers of the round before: each was idle when
// it reported, a call in flight keeps its caller busy until the reply, and
// any work between two reports would have changed a number.
// Handlers keep serving while this runs, so calls they make are waited for.
// Every worker must call Shutdown(graceful); one that died makes the others
// fail with ErrTimeout (the context's deadline, DefaultTimeout without one)
// naming it, after which they close anyway.
//
// Immediate (graceful false): the agent closes its listener and connections
// at once; its calls in flight fail with ErrClosed, its running handlers see
// their context cancelled, and the peers' calls to it fail with ErrPeerLost.
//
// Shutdown first runs the hooks added with OnShutdown (rref releases the
// references still held and reports them as leaked: see package rref); their
// errors are joined to the result. Shutdown completes in every case; a
// second call returns an error wrapping ErrClosed.
func (a *Agent) Shutdown(ctx context.Context, graceful bool) error {
	a.mu.Lock()
	if a.state != stateRunning {
		a.mu.Unlock()
		return fmt.Errorf("%w: rpc: agent %s is already shut down", ErrClosed, a.self)
	}
	a.state = stateDraining
	close(a.shutdown)
	a.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.opts.timeout)
		defer cancel()
	}
	var errs []error
	a.hooksMu.Lock()
	hooks := append([]ShutdownHook(nil), a.hooks...)
	a.hooksMu.Unlock()
	for _, h := range hooks {
		if err := h(ctx, graceful); err != nil {
			errs = append(errs, err)
		}
	}
	if graceful {
		if err := a.drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	a.closeAll()
	if a.ownSt != nil {
		if err := a.ownSt.Close(); err != nil && !errors.Is(err, ErrClosed) {
			errs = append(errs, fmt.Errorf("rpc: closing the store: %w", err))
		}
	}
	return errors.Join(errs...)
}

// exitSetTimeout bounds the last store write of a graceful shutdown, made
// when every worker is already known to be idle.
const exitSetTimeout = 5 * time.Second

// drain runs the termination rounds of a graceful shutdown.
func (a *Agent) drain(ctx context.Context) error {
	world := len(a.workers)
	var prev []string
	for round := 0; ; round++ {
		if err := a.waitQuiet(ctx); err != nil {
			return err
		}
		s, r := a.m.sent.Load(), a.m.received.Load()
		prefix := "shutdown/" + strconv.Itoa(round) + "/"
		if err := a.st.Set(ctx, a.key(prefix+strconv.Itoa(a.self.ID)), []byte(fmt.Sprintf("%d %d", s, r))); err != nil {
			return fmt.Errorf("rpc: graceful shutdown of %s: %w", a.self, err)
		}
		vals, err := a.getAll(ctx, prefix, world)
		if err != nil {
			return fmt.Errorf("rpc: graceful shutdown of %s, round %d: %w", a.self, round, err)
		}
		cur := make([]string, len(vals))
		for i, v := range vals {
			cur[i] = string(v)
		}
		if slices.Equal(cur, prev) {
			break
		}
		prev = cur
	}
	// Whoever serves the store must stay until everyone has read the last
	// round: each worker says it is leaving. The rounds above already proved
	// every worker idle, so for a worker that does not serve the store this
	// is a courtesy to the server: the server may close the store as soon as
	// it has seen every exit, which can make this Set's reply go missing and
	// its retry find no server. That loss (a lost or closed store) is not
	// an error, and the Set gets a short bound of its own.
	exitKey := a.key("shutdown/exit/" + strconv.Itoa(a.self.ID))
	if a.ownSt != nil && a.self.ID == 0 {
		if err := a.st.Set(ctx, exitKey, []byte{1}); err != nil {
			return fmt.Errorf("rpc: graceful shutdown of %s: %w", a.self, err)
		}
	} else {
		sctx, cancel := context.WithTimeout(ctx, exitSetTimeout)
		err := a.st.Set(sctx, exitKey, []byte{1})
		cancel()
		if err != nil && !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("rpc: graceful shutdown of %s: %w", a.self, err)
		}
	}
	if a.ownSt != nil && a.self.ID == 0 {
		if _, err := a.getAll(ctx, "shutdown/exit/", world); err != nil {
			return fmt.Errorf("rpc: graceful shutdown of %s, waiting for every worker to leave: %w", a.self, err)
		}
	}
	return nil
}

// getAll reads key prefix+rank for every rank, naming the missing ranks if
// they do not all appear in time.
func (a *Agent) getAll(ctx context.Context, prefix string, world int) ([][]byte, error) {
	keys := make([]string, world)
	for i := range keys {
		keys[i] = a.key(prefix + strconv.Itoa(i))
	}
	vals, err := a.st.MultiGet(ctx, keys)
	if err == nil {
		return vals, nil
	}
	var missing []string
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i, k := range keys {
		if ok, cerr := a.st.Check(cctx, []string{k}); cerr == nil && !ok {
			missing = append(missing, a.workers[i].String())
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("waiting for %s (dead, or not calling Shutdown): %w", strings.Join(missing, ", "), err)
	}
	return nil, err
}

// waitQuiet waits until this worker has no call, request or held work in
// flight.
func (a *Agent) waitQuiet(ctx context.Context) error {
	t := time.NewTicker(500 * time.Microsecond)
	defer t.Stop()
	for {
		c, s, h := a.m.clientInFlight.Load(), a.m.serverInFlight.Load(), a.m.held.Load()
		if c == 0 && s == 0 && h == 0 {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctxError(ctx, fmt.Sprintf("rpc: graceful shutdown of %s waiting for its own work (%d calls, %d requests, %d held)", a.self, c, s, h))
		}
	}
}

// closeAll closes the listener and every connection.
func (a *Agent) closeAll() {
	a.mu.Lock()
	a.state = stateClosed
	servers := make([]*conn, 0, len(a.servers))
	for c := range a.servers {
		servers = append(servers, c)
	}
	a.mu.Unlock()
	a.ln.Close()
	for _, s := range a.peers {
		if c := s.cur.Load(); c != nil {
			c.close(errAgentClosed)
		}
	}
	for _, c := range servers {
		c.close(errAgentClosed)
	}
	a.cancelBase()
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		a.opts.logger.Warn("rpc: connection goroutines still running 10s after shutdown", "worker", a.self.Name)
	}
}
