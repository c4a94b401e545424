//go:build unix

package main

// `tandem bench elastic`: what faults cost an elastic job (package elastic).
// The bench serves a store on loopback and starts -nproc member processes
// (this binary in a hidden member mode, one core each) that train an MLP
// data-parallel with a fixed global batch. It runs the job twice for
// -duration: once undisturbed, then injecting a fault every -fault-every,
// cycling through -faults: "kill" (SIGKILL one member, start a fresh one in
// its place -rejoin-after later; the newcomer is healed from a live member)
// and "stop" (SIGSTOP one member for -stop-for, then SIGCONT: it finds its
// round gone and must rejoin). Members report every committed step and
// every round they enter; from those the bench prints, per fault, the time
// to detect it, to resume, the steps lost against the undisturbed rate and
// when the victim's replacement trained again, and the run's committed
// steps per second against the undisturbed run's.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

func init() {
	addWorkerBench("elastic", "faults in an elastic DDP job: detect, resume, steps lost, throughput vs fault-free: tandem bench elastic [-nproc 3] [-duration 60s] [-fault-every 15s] [-faults kill,stop] [-json]",
		benchElastic)
}

// elasticBenchConfig is the parent's view of the flags.
type elasticBenchConfig struct {
	nproc                        int
	duration, every              time.Duration
	rejoinAfter, stopFor, settle time.Duration
	faults                       []string
	sizesFlag                    string
	sizes                        []int
	batch, minSize               int
	verbose                      bool
	// rate is the fault-free run's steps per second, once measured.
	rate float64
	// flightDir takes the flight records the members write when a
	// fault aborts their process group (removed at the end).
	flightDir string
}

// elasticFaultResult is one fault: a line of `tandem bench elastic -json`.
// Durations are seconds from the injection; -1 where it was not seen.
type elasticFaultResult struct {
	Bench  string `json:"bench"`
	Fault  int    `json:"fault"`
	Kind   string `json:"kind"`
	Victim string `json:"victim"`
	// AtS is the injection's time from the start of the measured window.
	AtS float64 `json:"at_s"`
	// DetectS: the first survivor's elastic.Event.Detected; ResumeS: the
	// last survivor's Event.Resumed (the new round formed on all of them);
	// FirstStepS: the first step committed after that.
	DetectS    float64 `json:"detect_s"`
	ResumeS    float64 `json:"resume_s"`
	FirstStepS float64 `json:"first_step_s"`
	// Size is the survivors' round size after the fault.
	Size int `json:"size"`
	// CommittedBefore is the highest step committed anywhere before the
	// injection; ResumedFrom the step the survivors' round started from.
	// ResumedFrom < CommittedBefore would be a committed step lost.
	CommittedBefore int64 `json:"committed_before"`
	ResumedFrom     int64 `json:"resumed_from"`
	// IntervalS is the time from this fault to the next (or to the end of
	// the window); StepsLost the fault-free rate times IntervalS minus the
	// steps committed in it.
	IntervalS float64 `json:"interval_s"`
	StepsLost float64 `json:"steps_lost"`
	// Rejoiner is the member that came back: the newcomer started in a
	// killed member's place, or the stopped member itself. RejoinS is
	// from its start (or SIGCONT) to its first committed step, -1 when it
	// never committed one before the bench ended.
	Rejoiner string  `json:"rejoiner"`
	RejoinS  float64 `json:"rejoin_s"`
	Rejoined bool    `json:"rejoined"`
	// RejoinedAfter is the number of the later fault whose reconfiguration
	// took the rejoiner in, 0 when it came back by itself.
	RejoinedAfter int `json:"rejoined_after_fault,omitempty"`
	// Split: the rejoiner formed a round of its own beside the running
	// job (two jobs training apart).
	Split   bool   `json:"split,omitempty"`
	Skipped string `json:"skipped,omitempty"`
}

// elasticRunResult sums up one run of the job.
type elasticRunResult struct {
	Steps       int64   `json:"steps"`
	StepsPerS   float64 `json:"steps_per_s"`
	SamplesPerS float64 `json:"samples_per_s"`
	LoadStart   string  `json:"loadavg_start"`
	LoadEnd     string  `json:"loadavg_end"`
	// Exits lists members that ended on their own (an error), not by the
	// bench's hand.
	Exits []string `json:"member_exits,omitempty"`
	// BySize splits the window by the size of the round that committed
	// each step; StalledS is the time in gaps between two commits longer
	// than elasticStallGap (detection, re-forming, healing).
	BySize   []elasticSizeShare `json:"by_size"`
	StalledS float64            `json:"stalled_s"`
}

// elasticSizeShare is the part of a run a round size trained in: the
// steps it committed and the time between them.
type elasticSizeShare struct {
	Size      int     `json:"size"`
	Steps     int64   `json:"steps"`
	Seconds   float64 `json:"seconds"`
	StepsPerS float64 `json:"steps_per_s"`
}

// elasticStallGap is the gap between two commits that counts as a stall
// rather than a step.
const elasticStallGap = 200 * time.Millisecond

// elasticSummary is the last line of `tandem bench elastic -json`.
type elasticSummary struct {
	Bench       string           `json:"bench"`
	Summary     bool             `json:"summary"`
	Nproc       int              `json:"nproc"`
	DurationS   float64          `json:"duration_s"`
	FaultEveryS float64          `json:"fault_every_s"`
	GlobalBatch int              `json:"global_batch"`
	Sizes       string           `json:"sizes"`
	FaultFree   elasticRunResult `json:"fault_free"`
	Faulty      elasticRunResult `json:"faulty"`
	// Ratio is Faulty.StepsPerS / FaultFree.StepsPerS.
	Ratio           float64 `json:"ratio"`
	Faults          int     `json:"faults"`
	MedianDetectS   float64 `json:"median_detect_s"`
	MedianResumeS   float64 `json:"median_resume_s"`
	MedianStepsLost float64 `json:"median_steps_lost"`
	MedianRejoinS   float64 `json:"median_rejoin_s"`
	NotRejoined     int     `json:"not_rejoined"`
}

func benchElastic(ctx context.Context, args []string, stdout io.Writer, launch workerLauncher) error {
	fs := flag.NewFlagSet("tandem bench elastic", flag.ContinueOnError)
	nproc := fs.Int("nproc", 3, "member processes")
	duration := fs.Duration("duration", 60*time.Second, "length of each run (fault-free, then with faults)")
	every := fs.Duration("fault-every", 15*time.Second, "time between faults")
	faults := fs.String("faults", "kill,stop", "kinds of faults to cycle through: kill (SIGKILL, a new member after -rejoin-after), stop (SIGSTOP for -stop-for)")
	rejoinAfter := fs.Duration("rejoin-after", 2*time.Second, "after a kill, start a fresh member this long later")
	stopFor := fs.Duration("stop-for", 3*time.Second, "how long a stopped member stays stopped")
	settle := fs.Duration("settle", 10*time.Second, "after the run, how long to wait for the last victims to train again")
	sizesFlag := fs.String("sizes", "784,256,10", mlpSizesUsage)
	batch := fs.Int("batch", 96, "global batch (kept whatever the world's size: elastic.FixedGlobalBatch)")
	minSize := fs.Int("min-size", 0, "fewest members a round may have (0: nproc-1)")
	asJSON := fs.Bool("json", false, "print one JSON object per fault and a summary")
	verbose := fs.Bool("v", false, "pass the members' round and fault logs to stderr")
	worker := fs.Bool("worker", false, "internal: run as one member")
	storeAddr := fs.String("store", "", "internal: the member's store")
	job := fs.String("job", "", "internal: the member's job")
	id := fs.String("id", "", "internal: the member's ID")
	seed := fs.Uint64("seed", 0, "internal: the member's initial weights")
	maxSize := fs.Int("max-size", 0, "internal: the member's MaxSize")
	if err := parseBenchFlags(fs, args); err != nil {
		return err
	}
	sizes, err := parseLayerSizes(*sizesFlag)
	if err != nil {
		return err
	}
	if *batch < 1 {
		return fmt.Errorf("-batch %d: must be positive", *batch)
	}
	if *worker {
		return elasticMember(ctx, elasticMemberConfig{store: *storeAddr, job: *job, id: *id, sizes: sizes, batch: *batch,
			minSize: *minSize, maxSize: *maxSize, seed: *seed, verbose: *verbose}, stdout)
	}
	cfg := elasticBenchConfig{nproc: *nproc, duration: *duration, every: *every, rejoinAfter: *rejoinAfter, stopFor: *stopFor,
		settle: *settle, sizesFlag: *sizesFlag, sizes: sizes, batch: *batch, minSize: *minSize, verbose: *verbose}
	if cfg.nproc < 2 {
		return fmt.Errorf("-nproc %d: a job that survives a fault needs at least 2 members", cfg.nproc)
	}
	if cfg.minSize == 0 {
		cfg.minSize = cfg.nproc - 1
	}
	if cfg.minSize < 1 || cfg.minSize >= cfg.nproc {
		return fmt.Errorf("-min-size %d: must be in [1, nproc-1] so that a round survives one fault", cfg.minSize)
	}
	if cfg.duration <= 0 || cfg.every <= 0 || cfg.rejoinAfter < 0 || cfg.stopFor < 0 || cfg.settle < 0 {
		return fmt.Errorf("-duration and -fault-every must be positive, -rejoin-after, -stop-for and -settle not negative")
	}
	for s := cfg.minSize; s <= cfg.nproc; s++ {
		if cfg.batch%s != 0 {
			return fmt.Errorf("-batch %d: every world size from -min-size %d to -nproc %d must divide it (%d does not)", cfg.batch, cfg.minSize, cfg.nproc, s)
		}
	}
	for _, f := range strings.Split(*faults, ",") {
		f = strings.TrimSpace(f)
		if f != "kill" && f != "stop" {
			return fmt.Errorf("-faults: %q is not a fault (kill, stop)", f)
		}
		cfg.faults = append(cfg.faults, f)
	}

	if cfg.flightDir, err = os.MkdirTemp("", "tandem-bench-elastic-"); err != nil {
		return err
	}
	defer os.RemoveAll(cfg.flightDir)
	// Killed members leave connections reset: expected here, not worth a
	// warning each.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	srv, err := store.NewServer("127.0.0.1:0", store.WithLogger(quiet))
	if err != nil {
		return fmt.Errorf("serving the job's store: %w", err)
	}
	sctx, stopServe := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(sctx) }()
	defer func() { stopServe(); srv.Close(); <-served }()

	if !*asJSON {
		fmt.Fprintf(stdout, "elastic DDP, MLP %s, float32, global batch %d (elastic.FixedGlobalBatch), %d member processes, one core each (GOMAXPROCS=1), MinSize %d, store on loopback\n",
			cfg.sizesFlag, cfg.batch, cfg.nproc, cfg.minSize)
		fmt.Fprintf(stdout, "a %v run without faults, then a %v run with a fault every %v (%s; a killed member replaced after %v, a stopped one continued after %v)\n",
			cfg.duration, cfg.duration, cfg.every, strings.Join(cfg.faults, ","), cfg.rejoinAfter, cfg.stopFor)
	}
	base, _, err := runElasticJob(ctx, cfg, srv.Addr(), "fault-free", false, launch)
	if err != nil {
		return fmt.Errorf("the fault-free run: %w", err)
	}
	if !*asJSON {
		fmt.Fprintf(stdout, "fault-free: %d steps, %.2f steps/s (%.0f samples/s), load %s -> %s\n  %s\n",
			base.Steps, base.StepsPerS, base.SamplesPerS, base.LoadStart, base.LoadEnd, describeSizes(base))
	}
	cfg.rate = base.StepsPerS
	faulty, fr, err := runElasticJob(ctx, cfg, srv.Addr(), "faults", true, launch)
	if err != nil {
		return fmt.Errorf("the run with faults: %w", err)
	}
	sum := elasticSummary{Bench: "elastic", Summary: true, Nproc: cfg.nproc, DurationS: cfg.duration.Seconds(),
		FaultEveryS: cfg.every.Seconds(), GlobalBatch: cfg.batch, Sizes: cfg.sizesFlag, FaultFree: base, Faulty: faulty}
	if base.StepsPerS > 0 {
		sum.Ratio = faulty.StepsPerS / base.StepsPerS
	}
	var det, res, lost, rej []float64
	for _, f := range fr {
		if f.Skipped != "" {
			continue
		}
		sum.Faults++
		if f.DetectS >= 0 {
			det = append(det, f.DetectS)
		}
		if f.ResumeS >= 0 {
			res = append(res, f.ResumeS)
		}
		lost = append(lost, f.StepsLost)
		if f.Rejoined {
			rej = append(rej, f.RejoinS)
		} else {
			sum.NotRejoined++
		}
	}
	sum.MedianDetectS, sum.MedianResumeS, sum.MedianStepsLost, sum.MedianRejoinS = medianOf(det), medianOf(res), medianOf(lost), medianOf(rej)
	if *asJSON {
		for _, f := range fr {
			if err := writeJSONLine(stdout, f); err != nil {
				return err
			}
		}
		return writeJSONLine(stdout, sum)
	}
	printElasticTable(stdout, cfg, fr, sum)
	return nil
}

// printElasticTable writes the human-readable report.
func printElasticTable(w io.Writer, cfg elasticBenchConfig, fr []elasticFaultResult, sum elasticSummary) {
	d := func(s float64) string {
		if s < 0 {
			return "-"
		}
		return roundedSeconds(s, time.Millisecond)
	}
	fmt.Fprintf(w, "%3s %9s %5s %7s %9s %9s %10s %5s %11s %10s  %s\n", "#", "at", "kind", "victim", "detect", "resume", "1st step", "size", "from step", "steps lost", "rejoin")
	for _, f := range fr {
		if f.Skipped != "" {
			fmt.Fprintf(w, "%3d %9s %5s %7s  skipped: %s\n", f.Fault, d(f.AtS), f.Kind, f.Victim, f.Skipped)
			continue
		}
		rejoin := fmt.Sprintf("%s trained %s after it (re)started", f.Rejoiner, d(f.RejoinS))
		switch {
		case f.Split:
			rejoin = fmt.Sprintf("%s formed a round of its own beside the running job (SPLIT)", f.Rejoiner)
		case !f.Rejoined:
			rejoin = fmt.Sprintf("%s did NOT train again before the bench ended", f.Rejoiner)
		case f.RejoinedAfter > 0:
			rejoin += fmt.Sprintf(", only when fault %d re-formed the round", f.RejoinedAfter)
		}
		from := fmt.Sprintf("%d/%d", f.ResumedFrom, f.CommittedBefore)
		fmt.Fprintf(w, "%3d %9s %5s %7s %9s %9s %10s %5d %11s %10.1f  %s\n", f.Fault, d(f.AtS), f.Kind, f.Victim,
			d(f.DetectS), d(f.ResumeS), d(f.FirstStepS), f.Size, from, f.StepsLost, rejoin)
	}
	fmt.Fprintf(w, "with faults: %d steps, %.2f steps/s (%.0f samples/s) = %.1f%% of fault-free, load %s -> %s\n  %s\n",
		sum.Faulty.Steps, sum.Faulty.StepsPerS, sum.Faulty.SamplesPerS, 100*sum.Ratio, sum.Faulty.LoadStart, sum.Faulty.LoadEnd, describeSizes(sum.Faulty))
	fmt.Fprintf(w, "median over %d faults: detect %s, resume %s, steps lost %.1f, rejoin %s (%d victims did not train again)\n",
		sum.Faults, d(sum.MedianDetectS), d(sum.MedianResumeS), sum.MedianStepsLost, d(sum.MedianRejoinS), sum.NotRejoined)
	for _, e := range append(sum.FaultFree.Exits, sum.Faulty.Exits...) {
		fmt.Fprintf(w, "member exited on its own: %s\n", e)
	}
	fmt.Fprintf(w, `legend: times from the injection (SIGKILL or SIGSTOP); "at" from the start of the measured window, which opens at the first step
  committed by a round of all %d members. detect: the first survivor's elastic.Event.Detected; resume: the last survivor's
  Event.Resumed (its new round formed and healed); 1st step: the first step a survivor committed after that; size: that round's;
  from step: the step the survivors' round resumed from / the highest step committed anywhere before the fault (resuming from
  less would lose a committed step). steps lost: the fault-free run's steps/s times the time from this fault to the next (or
  to the window's end) minus the steps committed in that time: the step in flight that was discarded, the outage, the
  slower smaller round and the pause when the victim's replacement is healed in (negative when that time ran faster than
  the fault-free run's average). rejoin: from the newcomer's start (kill) or the SIGCONT (stop) to that member's first step
  committed in a round with others. size N: the time between consecutive commits made by rounds of N members, and the
  rate there (on a machine with fewer cores than members a smaller round can step faster); stalled: gaps between two
  commits longer than %v.
`, cfg.nproc, elasticStallGap)
}

// elasticProc is one member process.
type elasticProc struct {
	id      string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	mu      sync.Mutex
	ours    bool // the bench killed it
	stopped bool
}

// elasticJob is one run: its members and what they reported.
type elasticJob struct {
	cfg    elasticBenchConfig
	launch workerLauncher
	addr   string
	name   string

	mu     sync.Mutex
	steps  []elasticMemberLine // kind step, in arrival order
	rounds []elasticMemberLine // kind round
	procs  []*elasticProc
	exits  []string
	wg     sync.WaitGroup
}

// start starts member id.
func (j *elasticJob) start(id string, seed uint64) (*elasticProc, error) {
	args := []string{"-worker", "-store", j.addr, "-job", j.name, "-id", id, "-seed", strconv.FormatUint(seed, 10),
		"-sizes", j.cfg.sizesFlag, "-batch", strconv.Itoa(j.cfg.batch), "-min-size", strconv.Itoa(j.cfg.minSize),
		"-max-size", strconv.Itoa(j.cfg.nproc)}
	if j.cfg.verbose {
		args = append(args, "-v")
	}
	cmd, err := j.launch(args, []string{"GOMAXPROCS=1", "TANDEM_FLIGHT_DIR=" + j.cfg.flightDir})
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = workerSysProcAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &elasticProc{id: id, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting member %s: %w", id, err)
	}
	j.mu.Lock()
	j.procs = append(j.procs, p)
	j.mu.Unlock()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l elasticMemberLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				fmt.Fprintf(os.Stderr, "member %s printed %q: %v\n", id, sc.Text(), err)
				continue
			}
			j.mu.Lock()
			if l.Kind == "step" {
				j.steps = append(j.steps, l)
			} else {
				j.rounds = append(j.rounds, l)
			}
			j.mu.Unlock()
		}
		err := cmd.Wait()
		p.mu.Lock()
		ours := p.ours
		p.mu.Unlock()
		if !ours {
			j.mu.Lock()
			j.exits = append(j.exits, fmt.Sprintf("%s (%s run): %v", id, j.name, err))
			j.mu.Unlock()
		}
	}()
	return p, nil
}

// signal sends sig to p; kill marks the exit as the bench's doing.
func (p *elasticProc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch sig {
	case syscall.SIGKILL:
		p.ours = true
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	}
	return p.cmd.Process.Signal(sig)
}

// killAll kills every member and waits for them.
func (j *elasticJob) killAll() {
	j.mu.Lock()
	procs := slices.Clone(j.procs)
	j.mu.Unlock()
	for _, p := range procs {
		p.signal(syscall.SIGKILL)
	}
	j.wg.Wait()
}

// progress is the highest step committed by any member by time t.
func (j *elasticJob) progress(t time.Time) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var p int64
	for _, l := range j.steps {
		if l.T <= t.UnixNano() {
			p = max(p, l.Step)
		}
	}
	return p
}

// firstStep is the first step line after t that keep accepts.
func (j *elasticJob) firstStep(t time.Time, keep func(elasticMemberLine) bool) (elasticMemberLine, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var best elasticMemberLine
	found := false
	for _, l := range j.steps {
		if l.T > t.UnixNano() && keep(l) && (!found || l.T < best.T) {
			best, found = l, true
		}
	}
	return best, found
}

// training lists the members that committed a step within window before t
// and are neither killed nor stopped, by ID.
func (j *elasticJob) training(t time.Time, window time.Duration) []*elasticProc {
	j.mu.Lock()
	recent := map[string]bool{}
	for _, l := range j.steps {
		if l.T > t.Add(-window).UnixNano() && l.T <= t.UnixNano() {
			recent[l.ID] = true
		}
	}
	procs := slices.Clone(j.procs)
	j.mu.Unlock()
	var out []*elasticProc
	for _, p := range procs {
		p.mu.Lock()
		ok := !p.ours && !p.stopped && recent[p.id]
		p.mu.Unlock()
		if ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *elasticProc) int { return cmp.Compare(a.id, b.id) })
	return out
}

// running counts the members neither killed nor stopped, training or not
// (a member waiting for a round counts: it can form one with survivors).
func (j *elasticJob) running() int {
	j.mu.Lock()
	procs := slices.Clone(j.procs)
	j.mu.Unlock()
	n := 0
	for _, p := range procs {
		p.mu.Lock()
		if !p.ours && !p.stopped {
			n++
		}
		p.mu.Unlock()
	}
	return n
}

// bySize attributes the time between each step's first commit in
// [from, to] and the previous step's to the size of the round that
// committed it, or to stalls when the gap is longer than elasticStallGap.
func (j *elasticJob) bySize(from, to time.Time) ([]elasticSizeShare, float64) {
	j.mu.Lock()
	first := map[int64]elasticMemberLine{}
	for _, l := range j.steps {
		if l.T < from.UnixNano() || l.T > to.UnixNano() {
			continue
		}
		if f, ok := first[l.Step]; !ok || l.T < f.T {
			first[l.Step] = l
		}
	}
	j.mu.Unlock()
	steps := make([]elasticMemberLine, 0, len(first))
	for _, l := range first {
		steps = append(steps, l)
	}
	slices.SortFunc(steps, func(a, b elasticMemberLine) int { return cmp.Compare(a.Step, b.Step) })
	shares := map[int]*elasticSizeShare{}
	var stalled time.Duration
	for i := 1; i < len(steps); i++ {
		gap := time.Duration(steps[i].T - steps[i-1].T)
		if gap > elasticStallGap {
			stalled += gap
			continue
		}
		sh := shares[steps[i].Size]
		if sh == nil {
			sh = &elasticSizeShare{Size: steps[i].Size}
			shares[steps[i].Size] = sh
		}
		sh.Steps++
		sh.Seconds += gap.Seconds()
	}
	var out []elasticSizeShare
	for _, sh := range shares {
		if sh.Seconds > 0 {
			sh.StepsPerS = float64(sh.Steps) / sh.Seconds
		}
		out = append(out, *sh)
	}
	slices.SortFunc(out, func(a, b elasticSizeShare) int { return cmp.Compare(b.Size, a.Size) })
	return out, stalled.Seconds()
}

// describeSizes is the by-size part of a run's line.
func describeSizes(r elasticRunResult) string {
	var parts []string
	for _, sh := range r.BySize {
		parts = append(parts, fmt.Sprintf("size %d %.1fs at %.1f steps/s", sh.Size, sh.Seconds, sh.StepsPerS))
	}
	return fmt.Sprintf("%s; stalled %.1fs (gaps over %v)", strings.Join(parts, ", "), r.StalledS, elasticStallGap)
}

// returned is the first round the fault's rejoiner entered after it was
// started or continued. (A step line alone does not tell: a stopped member
// may print, once continued, the step it had committed before the stop.)
func (j *elasticJob) returned(f *elasticFault) (elasticMemberLine, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var back elasticMemberLine
	found := false
	for _, l := range j.rounds {
		if l.ID == f.Rejoiner && !f.recovered.IsZero() && l.Resumed > f.recovered.UnixNano() && (!found || l.Resumed < back.Resumed) {
			back, found = l, true
		}
	}
	return back, found
}

// elasticFault is an injected fault while the run goes on.
type elasticFault struct {
	elasticFaultResult
	at        time.Time
	survivors []string
	recovered time.Time // the newcomer's start or the SIGCONT; zero until then
}

// sleepUntil waits until t or the end of ctx.
func sleepUntil(ctx context.Context, t time.Time) error {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-tm.C:
		return nil
	}
}

// runElasticJob runs the job once for cfg.duration from its first step at
// full size, injecting faults when withFaults.
func runElasticJob(ctx context.Context, cfg elasticBenchConfig, addr, name string, withFaults bool, launch workerLauncher) (elasticRunResult, []elasticFaultResult, error) {
	j := &elasticJob{cfg: cfg, launch: launch, addr: addr, name: name}
	defer j.killAll()
	res := elasticRunResult{LoadStart: loadAvg()}
	next := 0
	newMember := func() (*elasticProc, error) {
		next++
		return j.start("m"+strconv.Itoa(next), uint64(next))
	}
	for range cfg.nproc {
		if _, err := newMember(); err != nil {
			return res, nil, err
		}
	}
	// The window opens at the first step of a round of every member.
	var t0 time.Time
	var p0 int64
	startBy := time.Now().Add(time.Minute)
	for t0.IsZero() {
		if l, ok := j.firstStep(time.Time{}, func(l elasticMemberLine) bool { return l.Size == cfg.nproc }); ok {
			t0, p0 = time.Unix(0, l.T), l.Step
			break
		}
		j.mu.Lock()
		exits := slices.Clone(j.exits)
		j.mu.Unlock()
		if len(exits) > 0 {
			return res, nil, fmt.Errorf("a member failed before the job trained: %s", strings.Join(exits, "; "))
		}
		if time.Now().After(startBy) {
			return res, nil, fmt.Errorf("no round of all %d members committed a step within a minute", cfg.nproc)
		}
		if err := sleepUntil(ctx, time.Now().Add(20*time.Millisecond)); err != nil {
			return res, nil, err
		}
	}
	end := t0.Add(cfg.duration)

	var faults []*elasticFault
	type action struct {
		at time.Time
		do func() error
	}
	var pending []action
	for k := 1; ; k++ {
		at := t0.Add(time.Duration(k) * cfg.every)
		faultDue := withFaults && at.Before(end)
		if len(pending) > 0 && (!faultDue || pending[0].at.Before(at)) {
			a := pending[0]
			pending = pending[1:]
			k-- // the fault is still to come
			if err := sleepUntil(ctx, a.at); err != nil {
				return res, nil, err
			}
			if err := a.do(); err != nil {
				return res, nil, err
			}
			continue
		}
		if !faultDue {
			break
		}
		if err := sleepUntil(ctx, at); err != nil {
			return res, nil, err
		}
		f := &elasticFault{elasticFaultResult: elasticFaultResult{Bench: "elastic", Fault: k, Kind: cfg.faults[(k-1)%len(cfg.faults)],
			DetectS: -1, ResumeS: -1, FirstStepS: -1, RejoinS: -1}}
		faults = append(faults, f)
		live := j.training(time.Now(), time.Second)
		if up := j.running(); len(live) == 0 || up-1 < cfg.minSize {
			f.at, f.Skipped = time.Now(), fmt.Sprintf("%d members training, %d running: a fault would leave fewer than MinSize %d", len(live), up, cfg.minSize)
			continue
		}
		victim := live[(k-1)%len(live)]
		f.Victim = victim.id
		for _, p := range live {
			if p != victim {
				f.survivors = append(f.survivors, p.id)
			}
		}
		f.CommittedBefore = j.progress(time.Now())
		switch f.Kind {
		case "kill":
			f.at = time.Now()
			if err := victim.signal(syscall.SIGKILL); err != nil {
				return res, nil, fmt.Errorf("killing %s: %w", victim.id, err)
			}
			pending = append(pending, action{f.at.Add(cfg.rejoinAfter), func() error {
				p, err := newMember()
				if err != nil {
					return err
				}
				f.Rejoiner, f.recovered = p.id, p.started
				return nil
			}})
		case "stop":
			f.at = time.Now()
			if err := victim.signal(syscall.SIGSTOP); err != nil {
				return res, nil, fmt.Errorf("stopping %s: %w", victim.id, err)
			}
			f.Rejoiner = victim.id
			pending = append(pending, action{f.at.Add(cfg.stopFor), func() error {
				f.recovered = time.Now()
				if err := victim.signal(syscall.SIGCONT); err != nil {
					return fmt.Errorf("continuing %s: %w", victim.id, err)
				}
				return nil
			}})
		}
		slices.SortStableFunc(pending, func(a, b action) int { return a.at.Compare(b.at) })
	}
	if err := sleepUntil(ctx, end); err != nil {
		return res, nil, err
	}
	// Give the last victims the chance to train again.
	rejoined := func(f *elasticFault) bool {
		if f.Skipped != "" {
			return true
		}
		back, ok := j.returned(f)
		if !ok || len(back.Members) < 2 {
			return ok // not yet, or a split: nothing more to wait for
		}
		_, ok = j.firstStep(time.Unix(0, back.Resumed), func(l elasticMemberLine) bool { return l.ID == f.Rejoiner })
		return ok
	}
	settleBy := time.Now().Add(cfg.settle)
	for time.Now().Before(settleBy) && slices.ContainsFunc(faults, func(f *elasticFault) bool { return !rejoined(f) }) {
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return res, nil, err
		}
	}
	j.killAll()
	res.LoadEnd = loadAvg()
	j.mu.Lock()
	res.Exits = slices.Clone(j.exits)
	j.mu.Unlock()
	res.Steps = j.progress(end) - p0
	res.StepsPerS = float64(res.Steps) / cfg.duration.Seconds()
	res.SamplesPerS = res.StepsPerS * float64(cfg.batch)
	res.BySize, res.StalledS = j.bySize(t0, end)

	out := make([]elasticFaultResult, len(faults))
	for i, f := range faults {
		f.AtS = f.at.Sub(t0).Seconds()
		if f.Skipped == "" {
			var nextFault time.Time
			if i+1 < len(faults) {
				nextFault = faults[i+1].at
			}
			j.measure(f, faults, cfg.rate, nextFaultAt(faults, i, end), nextFault)
		}
		out[i] = f.elasticFaultResult
	}
	return res, out, nil
}

// nextFaultAt is when the fault after faults[i] came, or end.
func nextFaultAt(faults []*elasticFault, i int, end time.Time) time.Time {
	if i+1 < len(faults) {
		return faults[i+1].at
	}
	return end
}

// measure fills f's figures from what the members reported.
//
// next is the end of the fault's interval (the next fault or the window's
// end), nextFault the next fault's injection (zero for the last).
func (j *elasticJob) measure(f *elasticFault, faults []*elasticFault, rate float64, next, nextFault time.Time) {
	secs := func(ns int64) float64 { return time.Unix(0, ns).Sub(f.at).Seconds() }
	var detected, resumed int64
	f.ResumedFrom = -1
	all := true
	j.mu.Lock()
	for _, id := range f.survivors {
		// The survivor's first round that formed after a detection at or
		// after the injection and before the next fault.
		var ev *elasticMemberLine
		for i := range j.rounds {
			l := &j.rounds[i]
			if l.ID == id && l.Detected >= f.at.UnixNano() && (nextFault.IsZero() || l.Detected < nextFault.UnixNano()) && (ev == nil || l.Resumed < ev.Resumed) {
				ev = l
			}
		}
		if ev == nil {
			all = false
			continue
		}
		if detected == 0 || ev.Detected < detected {
			detected = ev.Detected
		}
		if ev.Resumed > resumed {
			resumed, f.Size, f.ResumedFrom = ev.Resumed, ev.Size, ev.Step
		}
	}
	j.mu.Unlock()
	if detected != 0 {
		f.DetectS = secs(detected)
	}
	if all && resumed != 0 {
		f.ResumeS = secs(resumed)
		if l, ok := j.firstStep(time.Unix(0, resumed), func(l elasticMemberLine) bool { return slices.Contains(f.survivors, l.ID) }); ok {
			f.FirstStepS = secs(l.T)
		}
	}
	f.IntervalS = next.Sub(f.at).Seconds()
	f.StepsLost = rate*f.IntervalS - float64(j.progress(next)-j.progress(f.at))
	if f.recovered.IsZero() {
		return
	}
	// The rejoiner's first step in the round it came back to: a round
	// with others is the job, one alone is a second job.
	back, ok := j.returned(f)
	if !ok {
		return
	}
	if len(back.Members) < 2 && j.cfg.nproc > 1 {
		f.Split = true
		return
	}
	if l, ok := j.firstStep(time.Unix(0, back.Resumed), func(l elasticMemberLine) bool { return l.ID == f.Rejoiner }); ok {
		f.RejoinS, f.Rejoined = time.Unix(0, l.T).Sub(f.recovered).Seconds(), true
		for _, g := range faults {
			if g.Skipped == "" && g.at.After(f.at) && g.at.UnixNano() < back.Resumed {
				f.RejoinedAfter = g.Fault
			}
		}
	}
}
