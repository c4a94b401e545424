package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Bounds on the waits of the launcher that do not depend on -grace.
const (
	// killWait is how long workers get to vanish after SIGKILL before tandem
	// run gives up on them (a process stuck in the kernel).
	killWait = 10 * time.Second
	// signalPickWait is how long a cancelled context waits for the signal
	// that cancelled it, to pass that same signal on to the workers.
	signalPickWait = 100 * time.Millisecond
	// minDrainWait is the least time given to the workers' output pipes to
	// drain after the workers have exited.
	minDrainWait = time.Second
)

// workerProc is one started worker.
type workerProc struct {
	rank   int
	cmd    *exec.Cmd
	pid    int
	reaped bool // its exit has been seen
	sweep  bool // reaped while the job was being stopped: its group gets SIGKILL at the end
}

// workerExit is what a worker's Wait returned.
type workerExit struct {
	w     *workerProc
	state *os.ProcessState
	err   error
}

// outputPipe copies one output stream of one worker to the launcher's output.
type outputPipe struct {
	r    *os.File // launcher's end
	dst  io.Writer
	done chan struct{}
}

func (p *outputPipe) copy() {
	defer close(p.done)
	buf := make([]byte, 32<<10)
	broken := false // the destination failed: keep draining so the worker never blocks
	for {
		n, err := p.r.Read(buf)
		if n > 0 && !broken {
			if _, werr := p.dst.Write(buf[:n]); werr != nil {
				broken = true
			}
		}
		if err != nil {
			break
		}
	}
	if pw, ok := p.dst.(*prefixWriter); ok && !broken {
		_ = pw.Flush()
	}
}

// supervisor watches the workers of one node and stops them together.
type supervisor struct {
	cfg     runConfig
	errW    *lockedWriter
	workers []*workerProc
	exits   chan workerExit
	running int

	stopping bool
	killC    <-chan time.Time // grace after SIGTERM is over
	hardC    <-chan time.Time // SIGKILL was sent killWait ago
	killed   bool
}

// startWorkers starts cfg.nproc workers, prefixes their output onto stdout and
// stderr, and waits for them all. Signals arriving on signals are passed on
// to the workers; a cancelled ctx stops them with SIGTERM. The returned error
// carries the job's exit status in its ExitCode method; nil means every
// worker exited with status 0.
func startWorkers(ctx context.Context, cfg runConfig, stdout, stderr io.Writer, signals <-chan os.Signal) error {
	path, err := exec.LookPath(cfg.argv[0])
	if err != nil {
		return &exitError{code: 127, msg: fmt.Sprintf("cannot run %q: %v", cfg.argv[0], err), err: err}
	}
	outW := &lockedWriter{w: stdout}
	errW := &lockedWriter{w: stderr}
	s := &supervisor{cfg: cfg, errW: errW, exits: make(chan workerExit, cfg.nproc)}

	var pipes []*outputPipe
	var startErr error
	env := os.Environ()
	for local := 0; local < cfg.nproc; local++ {
		rank := cfg.rank(local)
		cmd := exec.Command(path, cfg.argv[1:]...)
		cmd.Args[0] = cfg.argv[0]
		cmd.Env = cfg.workerEnv(env, local)
		cmd.SysProcAttr = workerSysProcAttr()
		// Stdin stays /dev/null: workers live in background process groups,
		// where reading the terminal would stop them.
		var childEnds []*os.File
		var ps []*outputPipe
		for i, dst := range []struct {
			w    *lockedWriter
			orig io.Writer
		}{{outW, stdout}, {errW, stderr}} {
			var target io.Writer
			if f, ok := dst.orig.(*os.File); ok && !cfg.prefix {
				target = f // unprefixed output to a file or terminal needs no copying
			} else {
				r, w, err := os.Pipe()
				if err != nil {
					startErr = fmt.Errorf("making an output pipe for rank %d: %w", rank, err)
					break
				}
				p := &outputPipe{r: r, dst: dst.w, done: make(chan struct{})}
				if cfg.prefix {
					p.dst = newPrefixWriter(dst.w, fmt.Sprintf("[%d] ", rank))
				}
				ps = append(ps, p)
				childEnds = append(childEnds, w)
				target = w
			}
			if i == 0 {
				cmd.Stdout = target
			} else {
				cmd.Stderr = target
			}
		}
		if startErr == nil {
			if err := cmd.Start(); err != nil {
				startErr = fmt.Errorf("starting rank %d: %w", rank, err)
			}
		}
		for _, f := range childEnds {
			f.Close() // the worker holds its own copy now
		}
		if startErr != nil {
			for _, p := range ps {
				p.r.Close()
			}
			break
		}
		for _, p := range ps {
			go p.copy()
		}
		pipes = append(pipes, ps...)
		w := &workerProc{rank: rank, cmd: cmd, pid: cmd.Process.Pid}
		s.workers = append(s.workers, w)
		s.running++
		go func() {
			err := cmd.Wait()
			s.exits <- workerExit{w: w, state: cmd.ProcessState, err: err}
		}()
	}

	result := s.supervise(ctx, signals, startErr)
	drainOutput(pipes, max(cfg.grace, minDrainWait))
	return result
}

// supervise waits for every started worker to exit, stopping them all when
// one fails, a signal arrives or ctx ends, and returns the job's result.
func (s *supervisor) supervise(ctx context.Context, signals <-chan os.Signal, startErr error) error {
	var (
		failed      *workerExit // the first worker to fail
		failedCode  int
		interrupted os.Signal // the signal tandem run received
		canceled    error     // ctx's cause, when it ended without a signal
		stoppedN    int       // workers that were running when the stop began
		hardErr     error
		signaled    bool // a signal arrived, even while stopping: no restart
	)
	if startErr != nil {
		stoppedN = s.running
		s.stop(syscall.SIGTERM)
	}
	ctxDone := ctx.Done()
loop:
	for s.running > 0 {
		select {
		case ex := <-s.exits:
			s.running--
			ex.w.reaped = true
			code, _ := ex.outcome()
			if s.stopping {
				ex.w.sweep = true
				continue
			}
			if code != 0 {
				failed, failedCode = &ex, code
				stoppedN = s.running
				ex.w.sweep = true
				s.stop(syscall.SIGTERM)
			}
		case sig := <-signals:
			signaled = true
			if s.stopping {
				s.notef("received %v again; killing the workers now", sig)
				s.kill(false)
				continue
			}
			interrupted, stoppedN = sig, s.running
			s.stop(sig)
		case <-ctxDone:
			ctxDone = nil
			if s.stopping {
				continue
			}
			sig := os.Signal(syscall.SIGTERM)
			if signals != nil {
				// The context usually ends because of a signal that is on
				// its way to us too: pass on that one.
				select {
				case sig = <-signals:
					interrupted = sig
				case <-time.After(signalPickWait):
				}
			}
			if interrupted == nil {
				canceled = context.Cause(ctx)
			}
			stoppedN = s.running
			s.stop(sig)
		case <-s.killC:
			s.killC = nil
			s.kill(true)
		case <-s.hardC:
			var stuck []string
			for _, w := range s.workers {
				if !w.reaped {
					stuck = append(stuck, fmt.Sprintf("rank %d (pid %d)", w.rank, w.pid))
				}
			}
			hardErr = fmt.Errorf("%s still running %v after SIGKILL; giving up on them", strings.Join(stuck, ", "), killWait)
			break loop
		}
	}
	if s.stopping {
		// Whatever the stopped workers left behind in their process groups
		// goes too.
		for _, w := range s.workers {
			if w.sweep || !w.reaped {
				_ = signalGroup(w.pid, syscall.SIGKILL)
			}
		}
	}

	var res *exitError
	switch {
	case startErr != nil:
		res = &exitError{code: 1, err: startErr, msg: fmt.Sprintf("%v; stopped the %s already started", startErr, plural(stoppedN, "worker"))}
	case failed != nil:
		_, how := failed.outcome()
		res = &exitError{code: failedCode, err: failed.err, msg: fmt.Sprintf("rank %d (pid %d) %s", failed.w.rank, failed.w.pid, how), workerFailed: !signaled && ctx.Err() == nil,
			failedRank: failed.w.rank, failedHow: how}
		if stoppedN > 0 {
			res.msg += fmt.Sprintf("; stopped the other %s", plural(stoppedN, "worker"))
		}
	case interrupted != nil:
		code := 1
		if sn, ok := interrupted.(syscall.Signal); ok {
			code = 128 + int(sn)
		}
		res = &exitError{code: code, msg: fmt.Sprintf("received %v; stopped %s", interrupted, plural(stoppedN, "worker"))}
	case canceled != nil:
		res = &exitError{code: 1, err: canceled, msg: fmt.Sprintf("%v; stopped %s", canceled, plural(stoppedN, "worker"))}
	}
	if hardErr != nil {
		if res == nil {
			res = &exitError{code: 1}
		}
		if res.msg != "" {
			res.msg += "; "
		}
		res.msg += hardErr.Error()
	}
	if res == nil {
		return nil
	}
	return res
}

// stop sends sig to the process group of every worker still running (and of
// those that exited during the stop), and arms the SIGKILL timer.
func (s *supervisor) stop(sig os.Signal) {
	s.stopping = true
	for _, w := range s.workers {
		if !w.reaped || w.sweep {
			w.sweep = true
			if err := signalGroup(w.pid, sig); err != nil {
				s.notef("rank %d: %v", w.rank, err)
			}
		}
	}
	s.killC = time.After(s.cfg.grace)
}

// kill sends SIGKILL to every worker still running; late says it happens
// because -grace ran out.
func (s *supervisor) kill(late bool) {
	if s.killed {
		return
	}
	s.killed = true
	s.killC = nil
	for _, w := range s.workers {
		if !w.reaped || w.sweep {
			if !w.reaped && late {
				s.notef("rank %d (pid %d) still running %v after it was told to stop; sending SIGKILL", w.rank, w.pid, s.cfg.grace)
			}
			if err := signalGroup(w.pid, syscall.SIGKILL); err != nil {
				s.notef("rank %d: %v", w.rank, err)
			}
		}
	}
	s.hardC = time.After(killWait)
}

// notef writes one line from tandem run itself to its stderr.
func (s *supervisor) notef(format string, a ...any) {
	_, _ = s.errW.Write([]byte("tandem run: " + fmt.Sprintf(format, a...) + "\n"))
}

// outcome is a worker's exit code as tandem run reports it (128+N for
// signal N) and how it ended, in words: "exited with code 3", "was killed
// by signal 9 (killed)".
func (ex workerExit) outcome() (int, string) {
	if ex.state == nil {
		return 1, fmt.Sprintf("could not be waited for: %v", ex.err)
	}
	code, sig, signaled := exitStatus(ex.state)
	if signaled {
		return code, fmt.Sprintf("was killed by signal %d (%v)", int(sig), sig)
	}
	return code, fmt.Sprintf("exited with code %d", code)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// drainOutput waits up to wait for the workers' output to reach the
// launcher's stdout and stderr. A pipe still open after that is held by a
// process that a worker left running; it is closed, and what that process
// writes later is lost.
func drainOutput(pipes []*outputPipe, wait time.Duration) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for i, p := range pipes {
		select {
		case <-p.done:
			continue
		case <-deadline.C:
		}
		for _, q := range pipes[i:] {
			q.r.Close()
		}
		last := time.NewTimer(minDrainWait)
		defer last.Stop()
		for _, q := range pipes[i:] {
			select {
			case <-q.done:
			case <-last.C:
				return // a destination that does not take writes; leave it
			}
		}
		return
	}
	for _, p := range pipes {
		p.r.Close()
	}
}
