package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Shutdown stops the agent gracefully, as a program normally does at its
// end (PyTorch's rpc.shutdown(graceful=True)): every worker waits until the
// work of the whole group is done, then all stop. The workers run rounds
// through the store: in each, a worker waits until it has no call in
// flight, no request being served and no work started with Go, then
// publishes how many requests it has sent and received so far, and reads
// everyone's numbers. The group is done at the first round in which every
// worker's numbers equal its numbers of the round before: each was idle
// when it reported, a call in flight keeps its caller busy until the reply,
// and any work between two reports would have changed a number. Handlers
// keep serving while this runs, so calls they make are waited for.
//
// Every worker must call Shutdown, and a worker that calls it early (a
// parameter server with nothing else to do) waits for the others as long
// as they work: the context's deadline is the only bound, and without one
// there is none (the agent's DefaultTimeout is not applied). Meanwhile the
// agent watches the workers it waits for through its connections to them
// (see WithLivenessTimeout): one that died, exited without shutting down,
// or stopped answering fails the shutdown within a few seconds with
// ErrPeerLost naming it, and so does the loss of the store (with a store
// the agent made from MASTER_ADDR, served by worker 0). When the context's
// deadline passes first, the error wraps ErrTimeout and names the workers
// still missing, saying which of them are alive and connected (still
// working, or not calling Shutdown). In every case the agent then closes,
// as Close does; Close called meanwhile (from another goroutine) ends the
// wait at once.
//
// Shutdown first runs the hooks added with OnShutdown (rref releases the
// references still held and reports them as leaked: see package rref), and
// when it closes, those added with OnClose; their errors are joined to the
// result. Shutdown completes in every case; called on an agent that is
// already shutting down or closed, it returns an error wrapping ErrClosed.
func (a *Agent) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	if a.state != stateRunning {
		a.mu.Unlock()
		return fmt.Errorf("%w: rpc: shutdown: agent %s is already shut down", ErrClosed, a.self)
	}
	a.state = stateDraining
	close(a.shutdown)
	a.mu.Unlock()
	var errs []error
	a.hooksMu.Lock()
	hooks := append([]ShutdownHook(nil), a.hooks...)
	a.hooksMu.Unlock()
	for _, h := range hooks {
		if err := h(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// Close, called meanwhile, ends the lifetime and with it the wait.
	dctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(a.life.ctx, func() {
		cancel(fmt.Errorf("%w: rpc: shutdown: agent %s was closed during its graceful shutdown", ErrClosed, a.self))
	})
	err := a.drain(dctx)
	stop()
	if err != nil && ctx.Err() == nil && dctx.Err() != nil {
		err = fmt.Errorf("%w (the wait ended with: %v)", context.Cause(dctx), err)
	}
	cancel(nil)
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, a.close())
	return errors.Join(errs...)
}

// Close stops the agent at once (PyTorch's rpc.shutdown(graceful=False)):
// it closes its listener and connections; its calls in flight fail with
// ErrClosed, its running handlers see their context cancelled, and the
// peers' calls to it fail with ErrPeerLost. The hooks added with OnClose
// run first, and their errors are returned. Close waits (a few seconds at
// most) for the goroutines tied to the agent (its connections', and those
// started with Go) to return. Close during a graceful Shutdown ends its
// wait; a Close after the agent has closed returns an error wrapping
// ErrClosed.
func (a *Agent) Close() error {
	a.mu.Lock()
	switch a.state {
	case stateRunning:
		a.state = stateDraining
		close(a.shutdown)
	case stateClosed:
		a.mu.Unlock()
		return fmt.Errorf("%w: rpc: close: agent %s is already closed", ErrClosed, a.self)
	}
	a.mu.Unlock()
	return a.close()
}

// close closes the agent once: it runs the close hooks, closes the
// listener, the connections and the store the agent made.
func (a *Agent) close() error {
	a.closeOnce.Do(func() {
		var errs []error
		a.hooksMu.Lock()
		hooks := append([]CloseHook(nil), a.closeHooks...)
		a.hooksMu.Unlock()
		for _, h := range hooks {
			if err := h(); err != nil {
				errs = append(errs, err)
			}
		}
		a.closeAll()
		if a.ownSt != nil {
			if err := a.ownSt.Close(); err != nil && !errors.Is(err, ErrClosed) {
				errs = append(errs, fmt.Errorf("rpc: closing the store: %w", err))
			}
		}
		a.closeErr = errors.Join(errs...)
	})
	return a.closeErr
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
			return fmt.Errorf("rpc: graceful shutdown of %s: %w", a.self, a.storeLost(err))
		}
		vals, err := a.gather(ctx, prefix, world, fmt.Sprintf("its count of round %d", round))
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
		if _, err := a.gather(ctx, "shutdown/exit/", world, "that it is leaving"); err != nil {
			return fmt.Errorf("rpc: graceful shutdown of %s, waiting for every worker to leave: %w", a.self, err)
		}
	}
	return nil
}

// storeLost adds to a store error that says the store is lost which worker
// served it, when the agent made the store itself (worker 0 serves it).
func (a *Agent) storeLost(err error) error {
	if errors.Is(err, ErrPeerLost) && a.ownSt != nil && a.self.ID != 0 && len(a.workers) > 0 {
		return fmt.Errorf("the store, served by worker %s, is lost: %w", a.workers[0], err)
	}
	return err
}

// gather reads key prefix+id of every worker, waiting as long as ctx allows
// (without a deadline, as long as the workers it waits for are alive).
// It waits in slices of the agent's DefaultTimeout, so that no store
// timeout cuts the wait short, and watches the workers whose keys are
// missing (watchPeers): a lost one ends the wait at once, naming it. what
// says what the keys hold, for the messages.
func (a *Agent) gather(ctx context.Context, prefix string, world int, what string) ([][]byte, error) {
	keys := make([]string, world)
	for i := range keys {
		keys[i] = a.key(prefix + strconv.Itoa(i))
	}
	wctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	st := &peerStates{alive: make([]bool, world)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.watchPeers(wctx, fail, keys, what, st)
	}()
	defer func() {
		fail(nil)
		<-done
	}()
	for {
		began := time.Now()
		sctx, cancel := context.WithTimeout(wctx, a.opts.timeout)
		vals, err := a.st.MultiGet(sctx, keys)
		cancel()
		if err == nil {
			return vals, nil
		}
		waitOn := errors.Is(err, ErrTimeout) && !errors.Is(err, ErrPeerLost) // the slice ended, the store reachable
		early := time.Since(began) < a.opts.timeout/2
		if early && waitOn && ctx.Err() == nil && wctx.Err() == nil {
			// A store that gives up well before the slice's deadline (a
			// shorter limit of its own): wait a little before asking again.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-wctx.Done():
			}
		}
		if ctx.Err() == nil && wctx.Err() != nil {
			return nil, context.Cause(wctx) // a worker was lost
		}
		if ctx.Err() == nil && waitOn {
			if !early {
				if missing := a.missing(keys, st, false); len(missing) > 0 {
					a.opts.logger.Info("rpc: graceful shutdown still waiting", "worker", a.self.Name, "for", strings.Join(missing, ", "))
				}
			}
			continue
		}
		err = a.storeLost(err)
		if missing := a.missing(keys, st, true); len(missing) > 0 {
			return nil, fmt.Errorf("waiting for %s: %w", strings.Join(missing, ", "), err)
		}
		return nil, err
	}
}

// peerStates records which workers the watch found alive.
type peerStates struct {
	mu    sync.Mutex
	alive []bool
}

func (p *peerStates) set(id int, alive bool) {
	p.mu.Lock()
	p.alive[id] = alive
	p.mu.Unlock()
}

func (p *peerStates) get(id int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alive[id]
}

// missing names the workers whose keys are absent, with what the watch
// knows of them (explain), asking the store briefly.
func (a *Agent) missing(keys []string, st *peerStates, explain bool) []string {
	var out []string
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i, k := range keys {
		if ok, err := a.st.Check(cctx, []string{k}); err != nil || ok {
			continue
		}
		name := a.workers[i].String()
		switch {
		case !explain:
		case i == a.self.ID:
			name += " (this worker)"
		case st.get(i):
			name += " (alive and connected: still working, or not calling Shutdown)"
		default:
			name += " (not calling Shutdown, or unreachable)"
		}
		out = append(out, name)
	}
	return out
}

// watchPeers watches, until ctx ends, the workers whose keys are not there
// yet, through this agent's connections to them: it starts after one
// liveness interval (most groups are done by then), connects to a worker it
// has no connection to (once), and from then on relies on the connection's
// own liveness check. A worker whose connection is lost, and whose key is
// still absent (a worker that published it and left is not lost to us),
// fails the wait through fail with an error wrapping ErrPeerLost.
func (a *Agent) watchPeers(ctx context.Context, fail context.CancelCauseFunc, keys []string, what string, st *peerStates) {
	every := a.opts.live.Interval
	t := time.NewTicker(every)
	defer t.Stop()
	present := make([]bool, len(keys))
	present[a.self.ID] = true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for id := range keys {
			if present[id] || ctx.Err() != nil {
				continue
			}
			lost := a.probe(ctx, id)
			if ctx.Err() != nil {
				return
			}
			st.set(id, lost == nil)
			if lost == nil {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			ok, err := a.st.Check(cctx, []string{keys[id]})
			cancel()
			if err == nil && ok {
				present[id] = true
				continue
			}
			if ctx.Err() != nil {
				return
			}
			who := a.workers[id].String()
			if id == 0 && a.ownSt != nil {
				who += ", which served the store,"
			}
			fail(fmt.Errorf("%w: worker %s is lost without having published %s: %v", ErrPeerLost, who, what, lost))
			return
		}
	}
}

// probe reports why worker id counts as lost, or nil if this agent has a
// live connection to it (dialling one if there is none).
func (a *Agent) probe(ctx context.Context, id int) error {
	if c := a.peers[id].cur.Load(); c != nil {
		if !c.dead.Load() {
			return nil
		}
		c.pmu.Lock()
		reason := c.deadErr
		c.pmu.Unlock()
		if errors.Is(reason, errAgentClosed) {
			return nil // this agent is closing, not the peer
		}
		return reason
	}
	_, err := a.connect(ctx, a.workers[id], a.opts.timeout)
	return err
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

// closeAll closes the listener and every connection, and ends the
// agent's lifetime: it cancels the context of the goroutines tied to the
// agent and waits for them.
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
	if !a.life.end(closePatience) {
		a.opts.logger.Warn("rpc: goroutines of the agent (connections', or started with Agent.Go) still running after it closed", "worker", a.self.Name, "waited", closePatience)
	}
}

// closePatience bounds how long closing waits for the agent's goroutines.
const closePatience = 10 * time.Second
