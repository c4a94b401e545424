package ddp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm"
)

// Names of the events a Timeline records, as they appear in the trace.
const (
	EventStep      = "step"      // the whole of Step
	EventForward   = "forward"   // from the start of the graph's run to the loss
	EventBackward  = "backward"  // from the loss to the last gradient
	EventAllReduce = "allreduce" // one bucket: hand-over to the comm hook until its result is ready
	EventWait      = "wait"      // Step waiting for the reductions after the backward pass
	EventOptimizer = "optimizer" // the optimizer's step, recorded with Timeline.Span
)

// Lanes (Chrome-trace thread ids) of a rank's events: compute events on
// LaneCompute, bucket i's all-reduce on LaneBucket0+i, so that reductions
// in flight together sit on lanes of their own.
const (
	LaneCompute = 0
	LaneBucket0 = 1
)

// TraceEvent is one event of a Chrome trace (the JSON format that
// chrome://tracing and ui.perfetto.dev load): a complete event ("X") from Ts
// lasting Dur, or a metadata event ("M") naming a process or a thread. Times
// are in microseconds; Pid is the rank, Tid the lane.
type TraceEvent struct {
	Name string           `json:"name"`
	Cat  string           `json:"cat,omitempty"`
	Ph   string           `json:"ph"`
	Ts   int64            `json:"ts"`
	Dur  int64            `json:"dur"`
	Pid  int              `json:"pid"`
	Tid  int              `json:"tid"`
	Args map[string]int64 `json:"args,omitempty"`
	// Label is the name a metadata event gives (written as args.name).
	Label string `json:"-"`
}

// MarshalJSON writes a metadata event's Label as {"args":{"name":...}}.
func (e TraceEvent) MarshalJSON() ([]byte, error) {
	type plain TraceEvent
	if e.Ph != "M" || e.Label == "" {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		plain
		Args map[string]string `json:"args"`
	}{plain(e), map[string]string{"name": e.Label}})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (e *TraceEvent) UnmarshalJSON(b []byte) error {
	type plain TraceEvent
	var raw struct {
		plain
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*e = TraceEvent(raw.plain)
	for k, v := range raw.Args {
		switch v := v.(type) {
		case string:
			if k == "name" {
				e.Label = v
			}
		case float64:
			if e.Args == nil {
				e.Args = map[string]int64{}
			}
			e.Args[k] = int64(v)
		}
	}
	return nil
}

// Trace is a Chrome-trace JSON document: {"traceEvents": [...]}.
type Trace struct {
	TraceEvents     []TraceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit,omitempty"`
}

// Timeline records what a DDP does in each step, as Horovod's timeline does:
// the forward and backward passes, each bucket's all-reduce (with its index
// and bytes), the wait for the reductions after the backward pass, and
// whatever the training loop adds with Span (the optimizer step). Pass it to
// New with WithTimeline; one Timeline serves one DDP (one rank).
//
// Timestamps are wall-clock microseconds since the Unix epoch
// (time.Now().UnixMicro()), so the timelines of ranks on one host line up
// when merged. Across hosts they are only as aligned as the hosts' clocks
// (NTP keeps them within about a millisecond on a LAN, which is coarser than
// a small bucket's all-reduce): read cross-host gaps with that in mind.
//
// Only steps in the window given to NewTimeline are kept, so a long run
// writes a small file. A nil *Timeline records nothing; all its methods may
// be called on nil.
type Timeline struct {
	mu     sync.Mutex
	from   int64 // first step kept (counted from 0)
	n      int64 // steps kept; <= 0: all
	rank   int
	steps  int64 // steps begun
	last   int64 // index of the last step begun
	events []TraceEvent
	lanes  int // bucket lanes used
}

// NewTimeline returns a Timeline keeping steps from, from+1, ...,
// from+n-1 (Step calls counted from 0, NoSync steps included); n <= 0 keeps
// every step from from on.
func NewTimeline(from, n int) *Timeline {
	return &Timeline{from: int64(max(from, 0)), n: int64(n), last: -1}
}

// keeps reports whether step i is in the window.
func (t *Timeline) keeps(i int64) bool {
	return i >= t.from && (t.n <= 0 || i < t.from+t.n)
}

// Span records an event named name on the compute lane of the step that
// began last (for example EventOptimizer, timed around the optimizer's
// Step), if that step is in the window. It is a no-op on a nil Timeline.
func (t *Timeline) Span(name string, start, end time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last < 0 || !t.keeps(t.last) {
		return
	}
	t.add(name, LaneCompute, start, end, map[string]int64{"step": t.last})
}

func (t *Timeline) add(name string, lane int, start, end time.Time, args map[string]int64) {
	if start.IsZero() || end.IsZero() {
		return
	}
	d := end.UnixMicro() - start.UnixMicro()
	t.events = append(t.events, TraceEvent{Name: name, Cat: "ddp", Ph: "X", Ts: start.UnixMicro(), Dur: max(d, 0), Pid: t.rank, Tid: lane, Args: args})
}

// record adds a finished step of d: s is its state, start when Step began,
// runStart when the graph's run began, end now.
func (t *Timeline) record(rank int, s *stepState, start, runStart, end time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rank = rank
	i := t.steps
	t.steps++
	t.last = i
	if !t.keeps(i) {
		return
	}
	step := map[string]int64{"step": i}
	t.add(EventStep, LaneCompute, start, end, step)
	if s.forwardEnd.IsZero() || s.forwardEnd.After(s.backwardEnd) {
		t.add(EventForward+"+"+EventBackward, LaneCompute, runStart, s.backwardEnd, step)
	} else {
		t.add(EventForward, LaneCompute, runStart, s.forwardEnd, step)
		t.add(EventBackward, LaneCompute, s.forwardEnd, s.backwardEnd, step)
	}
	if !s.pl.sync {
		return
	}
	t.add(EventWait, LaneCompute, s.backwardEnd, end, step)
	for bi := range s.launchAt {
		var bytes int64
		if bi < len(s.buckets) {
			b := s.buckets[bi]
			bytes = int64(b.numel) * int64(b.dtype.Size())
		}
		t.add(EventAllReduce, LaneBucket0+bi, s.launchAt[bi], s.doneAt[bi], map[string]int64{"step": i, "bucket": int64(bi), "bytes": bytes})
		t.lanes = max(t.lanes, bi+1)
	}
}

// Events returns a copy of the events recorded so far, without metadata.
func (t *Timeline) Events() []TraceEvent {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.events)
}

// Trace returns this rank's events with the metadata naming the rank and
// its lanes.
func (t *Timeline) Trace() Trace {
	if t == nil {
		return Trace{TraceEvents: []TraceEvent{}}
	}
	return MergeTraces(Trace{TraceEvents: t.Events()})
}

// WriteTo writes this rank's trace as Chrome-trace JSON.
func (t *Timeline) WriteTo(w io.Writer) (int64, error) {
	return writeTrace(w, t.Trace())
}

// Gather collects the events of every rank of pg on root (with
// comm.GatherObject) and returns there the merged trace; the other ranks
// get an empty Trace. Every rank must call it, each with its own Timeline.
func (t *Timeline) Gather(ctx context.Context, pg *comm.ProcessGroup, root int) (Trace, error) {
	all, err := comm.GatherObject(ctx, pg, t.Events(), root)
	if err != nil {
		return Trace{}, fmt.Errorf("ddp: gathering the timelines on rank %d: %w", root, err)
	}
	if pg.Rank() != root {
		return Trace{}, nil
	}
	ts := make([]Trace, len(all))
	for r, evs := range all {
		for k := range evs {
			evs[k].Pid = r
		}
		ts[r] = Trace{TraceEvents: evs}
	}
	return MergeTraces(ts...), nil
}

// MergeTraces merges the traces of several ranks into one: their complete
// events, sorted by time, and metadata events naming each rank ("rank N")
// and its lanes ("compute", "bucket i"). Metadata in the inputs is replaced.
func MergeTraces(ts ...Trace) Trace {
	var evs []TraceEvent
	lanes := map[int]map[int]bool{}
	for _, t := range ts {
		for _, e := range t.TraceEvents {
			if e.Ph == "M" {
				continue
			}
			evs = append(evs, e)
			if lanes[e.Pid] == nil {
				lanes[e.Pid] = map[int]bool{}
			}
			lanes[e.Pid][e.Tid] = true
		}
	}
	slices.SortStableFunc(evs, func(a, b TraceEvent) int {
		if a.Ts != b.Ts {
			return int(min(max(a.Ts-b.Ts, -1), 1))
		}
		return int(min(max(b.Dur-a.Dur, -1), 1)) // enclosing event first
	})
	out := Trace{DisplayTimeUnit: "ms"}
	var pids []int
	for p := range lanes {
		pids = append(pids, p)
	}
	slices.Sort(pids)
	for _, p := range pids {
		out.TraceEvents = append(out.TraceEvents,
			TraceEvent{Name: "process_name", Ph: "M", Pid: p, Label: fmt.Sprintf("rank %d", p)},
			TraceEvent{Name: "process_sort_index", Ph: "M", Pid: p, Args: map[string]int64{"sort_index": int64(p)}})
		var tids []int
		for l := range lanes[p] {
			tids = append(tids, l)
		}
		slices.Sort(tids)
		for _, l := range tids {
			name := "compute"
			if l >= LaneBucket0 {
				name = fmt.Sprintf("bucket %d", l-LaneBucket0)
			}
			out.TraceEvents = append(out.TraceEvents, TraceEvent{Name: "thread_name", Ph: "M", Pid: p, Tid: l, Label: name})
		}
	}
	out.TraceEvents = append(out.TraceEvents, evs...)
	if out.TraceEvents == nil {
		out.TraceEvents = []TraceEvent{}
	}
	return out
}

// ReadTrace reads a Chrome-trace JSON document: an object with
// traceEvents, or a bare array of events.
func ReadTrace(r io.Reader) (Trace, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return Trace{}, fmt.Errorf("ddp: reading a trace: %w", err)
	}
	var t Trace
	if err := json.Unmarshal(b, &t); err == nil && t.TraceEvents != nil {
		return t, nil
	}
	if err := json.Unmarshal(b, &t.TraceEvents); err != nil {
		return Trace{}, fmt.Errorf("ddp: a trace must be Chrome-trace JSON ({\"traceEvents\": [...]} or [...]): %v: %w", err, ErrInvalidArgument)
	}
	return t, nil
}

// MergeTimelines reads the per-rank trace files (written by
// Timeline.WriteTo) and writes to w one Chrome-trace JSON holding them
// all, as MergeTraces merges them.
func MergeTimelines(w io.Writer, files ...string) error {
	var ts []Trace
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return fmt.Errorf("ddp: MergeTimelines: %w", err)
		}
		t, err := ReadTrace(fh)
		fh.Close()
		if err != nil {
			return fmt.Errorf("ddp: MergeTimelines: %s: %w", f, err)
		}
		ts = append(ts, t)
	}
	_, err := writeTrace(w, MergeTraces(ts...))
	return err
}

// WriteTrace writes t as Chrome-trace JSON, one event a line.
func WriteTrace(w io.Writer, t Trace) error {
	_, err := writeTrace(w, t)
	return err
}

func writeTrace(w io.Writer, t Trace) (int64, error) {
	var buf []byte
	buf = append(buf, `{"displayTimeUnit":"ms","traceEvents":[`...)
	for i, e := range t.TraceEvents {
		b, err := json.Marshal(e)
		if err != nil {
			return 0, fmt.Errorf("ddp: encoding a trace event: %w", err)
		}
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, '\n')
		buf = append(buf, b...)
	}
	buf = append(buf, "\n]}\n"...)
	n, err := w.Write(buf)
	if err != nil {
		return int64(n), fmt.Errorf("ddp: writing a trace: %w", err)
	}
	return int64(n), nil
}

// WithTimeline records every step of the DDP into t (see Timeline). Off by
// default; a nil t leaves it off. Recording costs a few allocations a step
// and one graph hook on the loss.
func WithTimeline(t *Timeline) Option {
	return func(c *config) error { c.timeline = t; return nil }
}

// Timeline returns the Timeline given with WithTimeline, or nil.
func (d *DDP) Timeline() *Timeline { return d.cfg.timeline }
