package comm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/tandemml/tandem/launch"
)

// The flight recorder.
//
// Every process group keeps its last operations (DefaultFlightRecorderSize
// of them unless WithFlightRecorder says otherwise) in a ring that is
// allocated once, with the group: an operation's record is written in
// place when it is issued and updated when it starts and ends, under a
// mutex of the recorder's own that nothing else holds for long. At
// DebugDetail the record also keeps the program counters of the code that
// issued the operation, in a second preallocated ring, and the dump turns
// them into function names and lines.
//
// The records of every group of a world are written to one JSON file per
// rank (FlightRecord) when the world aborts: a collective that timed out, a
// lost or unresponsive peer, a failed DDP step, ProcessGroup.Abort. They are
// also written on request (DumpFlightRecord, WriteFlightRecord) and on
// SIGUSR1 once DumpOnSignal is installed (which NewProcessGroup does at
// DebugInfo and above). `tandem debug` reads the files of all ranks and
// says which rank did not reach which operation.

// DefaultFlightRecorderSize is the number of operations each process group
// remembers unless WithFlightRecorder sets another.
const DefaultFlightRecorderSize = 2000

// flightStackDepth is the number of frames kept per operation at DETAIL.
const flightStackDepth = 16

// flightVersion is the version of the dump's format.
const flightVersion = 1

// Operation states in the flight record.
const (
	flightQueued uint8 = iota
	flightRunning
	flightDone
	flightFailed
)

var flightStates = [...]string{"queued", "running", "done", "failed"}

// flightEntry is one operation's record.
type flightEntry struct {
	ord             uint64 // 1 for the group's first record; 0: empty slot
	seq             uint32
	kind, desc      string
	p2p             bool // a send or receive: seq counts its stream; peer and tag name it
	peer, tag       int
	enq, start, end int64 // Unix nanoseconds; 0: not yet
	state           uint8
	err             error
	stack           []uintptr // a slice of flightRecorder.pcs, at DETAIL
}

// flightRecorder is a group's ring of records. A nil recorder records
// nothing.
type flightRecorder struct {
	mu   sync.Mutex
	ring []flightEntry
	n    uint64    // records written so far
	pcs  []uintptr // len(ring)*flightStackDepth program counters, at DETAIL
}

func newFlightRecorder(size int, detail bool) *flightRecorder {
	if size <= 0 {
		return nil
	}
	r := &flightRecorder{ring: make([]flightEntry, size)}
	if detail {
		r.pcs = make([]uintptr, size*flightStackDepth)
	}
	return r
}

// record notes a collective as queued and returns its ordinal, with which
// started and ended find it again (unless the ring has moved past it).
func (r *flightRecorder) record(seq uint32, op *collective) uint64 {
	if r == nil {
		return 0
	}
	return r.put(flightEntry{seq: seq, kind: op.name, desc: op.desc})
}

// recordP2P notes a send or receive as queued: the seq-th message (from 0)
// of its stream, the messages between this rank and peer under tag in
// that direction.
func (r *flightRecorder) recordP2P(kind, desc string, seq uint32, peer, tag int) uint64 {
	if r == nil {
		return 0
	}
	return r.put(flightEntry{seq: seq, kind: kind, desc: desc, p2p: true, peer: peer, tag: tag})
}

// put writes e as the newest record, queued now, with the caller's stack
// at DETAIL.
func (r *flightRecorder) put(e flightEntry) uint64 {
	now := time.Now().UnixNano()
	r.mu.Lock()
	r.n++
	ord := r.n
	i := int((ord - 1) % uint64(len(r.ring)))
	e.ord, e.enq, e.state = ord, now, flightQueued
	if r.pcs != nil {
		s := r.pcs[i*flightStackDepth : (i+1)*flightStackDepth]
		// Skip runtime.Callers, put, record (or recordP2P) and start (or p2p).
		e.stack = s[:runtime.Callers(4, s)]
	}
	r.ring[i] = e
	r.mu.Unlock()
	return ord
}

// started notes that the operation ord began to run.
func (r *flightRecorder) started(ord uint64) {
	if r == nil {
		return
	}
	now := time.Now().UnixNano()
	r.mu.Lock()
	if e := &r.ring[(ord-1)%uint64(len(r.ring))]; e.ord == ord {
		e.start, e.state = now, flightRunning
	}
	r.mu.Unlock()
}

// ended notes the end of the operation ord, with its error.
func (r *flightRecorder) ended(ord uint64, err error) {
	if r == nil {
		return
	}
	now := time.Now().UnixNano()
	r.mu.Lock()
	if e := &r.ring[(ord-1)%uint64(len(r.ring))]; e.ord == ord {
		e.end, e.state, e.err = now, flightDone, err
		if err != nil {
			e.state = flightFailed
		}
	}
	r.mu.Unlock()
}

// snapshot copies the records out, oldest first, and the number written.
func (r *flightRecorder) snapshot() ([]flightEntry, uint64) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.n
	k := min(n, uint64(len(r.ring)))
	out := make([]flightEntry, 0, k)
	for ord := n - k + 1; ord <= n; ord++ {
		e := r.ring[(ord-1)%uint64(len(r.ring))]
		e.stack = append([]uintptr(nil), e.stack...)
		out = append(out, e)
	}
	return out, n
}

// FlightRecord is what one rank's flight recorder holds: the JSON that
// dumps contain and that `tandem debug` reads.
type FlightRecord struct {
	Version   int       `json:"version"`
	Rank      int       `json:"rank"` // world rank
	WorldSize int       `json:"world_size"`
	PID       int       `json:"pid"`
	Host      string    `json:"host"`
	Time      time.Time `json:"time"`   // when the record was taken
	Reason    string    `json:"reason"` // why: the abort's cause, "SIGUSR1", "on request"
	// PeerErrors holds, by world rank, the transport's account of each
	// link that failed (an unresponsive or lost peer), leaving out the links
	// this rank's own abort cut and the peers that aborted and said so,
	// which PeerAborts holds (ErrPeerAborted: what they sent as their
	// cause).
	PeerErrors map[string]string `json:"peer_errors,omitempty"`
	PeerAborts map[string]string `json:"peer_aborts,omitempty"`
	Groups     []FlightGroup     `json:"groups"`
}

// FlightGroup is one process group's part of a FlightRecord.
type FlightGroup struct {
	Name    string `json:"name"`
	ID      uint32 `json:"id"`
	Rank    int    `json:"rank"` // this process's rank in the group
	Size    int    `json:"size"`
	Members []int  `json:"members"` // world ranks, in group rank order
	// NextSeq is the sequence number the group's next collective will
	// get; Recorded the number of operations recorded since the group was
	// made (more than len(Ops) once the ring is full).
	NextSeq  uint32     `json:"next_seq"`
	Recorded uint64     `json:"recorded"`
	Ops      []FlightOp `json:"ops"`
}

// FlightOp is one operation in a FlightRecord: a collective, or a
// point-to-point send or receive (P2P set).
type FlightOp struct {
	// Ord numbers the group's records from 1, collectives and
	// point-to-point operations alike, in the order they were issued.
	Ord uint64 `json:"ord"`
	// Seq is a collective's sequence number in its group, which every rank
	// gives the same collective; for a send or receive, its number (from
	// 0) in its stream, which the matching operation on the peer has too.
	Seq  uint32 `json:"seq"`
	Kind string `json:"kind"` // "all_reduce"; "send" or "recv"
	// Desc is the collective's fingerprint, which every rank must agree
	// on: its kind, dtype, shape and reduction, e.g.
	// "all_reduce(float32,[4],sum)"; for a send or receive its dtype,
	// shape, peer and tag, e.g. "send(float32,[4],to=1,tag=0)".
	Desc string `json:"desc"`
	// P2P names a send's or receive's stream; nil for a collective.
	P2P      *FlightP2P `json:"p2p,omitempty"`
	State    string     `json:"state"` // queued, running, done, failed
	Enqueued time.Time  `json:"enqueued"`
	Started  time.Time  `json:"started,omitzero"`
	Ended    time.Time  `json:"ended,omitzero"`
	Error    string     `json:"error,omitempty"`
	Stack    []string   `json:"stack,omitempty"` // at DETAIL: "function file:line", innermost first
}

// FlightP2P names the stream of a send or receive: the messages between
// this rank and Peer (a rank of the group) under Tag, in one direction.
// Send number n from rank a to rank b matches receive number n on b from a.
type FlightP2P struct {
	Peer int `json:"peer"`
	Tag  int `json:"tag"`
}

// flightRecord gathers the records of every group of the world.
func (w *world) flightRecord(reason string) FlightRecord {
	host, _ := os.Hostname()
	rec := FlightRecord{Version: flightVersion, Rank: w.t.Rank(), WorldSize: w.t.Size(), PID: os.Getpid(),
		Host: host, Time: time.Now(), Reason: reason}
	// Once this rank aborted, its transport fails every link with that
	// abort: those say nothing about the peers, and are left out.
	self := w.aborted()
	for r := 0; r < w.t.Size(); r++ {
		if r == w.t.Rank() {
			continue
		}
		err := w.peerLost(r)
		switch {
		case err == nil || (self != nil && errors.Is(err, self)):
		case errors.Is(err, ErrPeerAborted):
			if rec.PeerAborts == nil {
				rec.PeerAborts = map[string]string{}
			}
			rec.PeerAborts[strconv.Itoa(r)] = err.Error()
		default:
			if rec.PeerErrors == nil {
				rec.PeerErrors = map[string]string{}
			}
			rec.PeerErrors[strconv.Itoa(r)] = err.Error()
		}
	}
	w.mu.Lock()
	groups := append([]*ProcessGroup(nil), w.groups...)
	w.mu.Unlock()
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].id < groups[j].id })
	for _, pg := range groups {
		if pg.rank < 0 {
			continue
		}
		pg.mu.Lock()
		next := pg.seq
		pg.mu.Unlock()
		entries, n := pg.flight.snapshot()
		g := FlightGroup{Name: pg.name, ID: pg.id, Rank: pg.rank, Size: len(pg.members),
			Members: append([]int(nil), pg.members...), NextSeq: next, Recorded: n, Ops: make([]FlightOp, 0, len(entries))}
		for _, e := range entries {
			op := FlightOp{Ord: e.ord, Seq: e.seq, Kind: e.kind, Desc: e.desc, State: flightStates[e.state], Enqueued: time.Unix(0, e.enq)}
			if e.p2p {
				op.P2P = &FlightP2P{Peer: e.peer, Tag: e.tag}
			}
			if e.start != 0 {
				op.Started = time.Unix(0, e.start)
			}
			if e.end != 0 {
				op.Ended = time.Unix(0, e.end)
			}
			if e.err != nil {
				op.Error = e.err.Error()
			}
			if len(e.stack) > 0 {
				frames := runtime.CallersFrames(e.stack)
				for {
					f, more := frames.Next()
					op.Stack = append(op.Stack, fmt.Sprintf("%s %s:%d", f.Function, f.File, f.Line))
					if !more {
						break
					}
				}
			}
			g.Ops = append(g.Ops, op)
		}
		rec.Groups = append(rec.Groups, g)
	}
	return rec
}

// FlightRecord returns the flight records of every group of this group's
// world on this rank (this group and its subgroups, or its parent), as
// they stand now.
func (pg *ProcessGroup) FlightRecord() FlightRecord {
	return pg.world.flightRecord("on request")
}

// WriteFlightRecord writes FlightRecord to wr as indented JSON.
func (pg *ProcessGroup) WriteFlightRecord(wr io.Writer) error {
	return writeFlightJSON(wr, pg.world.flightRecord("on request"))
}

// DumpFlightRecord writes the flight record to this rank's file in the
// flight directory (WithFlightDir, else $TANDEM_FLIGHT_DIR, else a
// directory under os.TempDir(); see launch.Debug) and returns its path:
// the file that dumps on an abort or SIGUSR1 also write.
func (pg *ProcessGroup) DumpFlightRecord() (string, error) {
	return pg.world.dumpFlight("on request")
}

func writeFlightJSON(wr io.Writer, rec FlightRecord) error {
	enc := json.NewEncoder(wr)
	enc.SetIndent("", " ")
	if err := enc.Encode(rec); err != nil {
		return fmt.Errorf("comm: writing the flight record: %w", err)
	}
	return nil
}

// FlightFileName is the name of world rank rank's dump in the flight
// directory.
func FlightFileName(rank int) string { return fmt.Sprintf("rank%d.json", rank) }

// dumpFlight writes the record to this rank's file, replacing the previous
// one whole (so that a reader never sees half a dump), and logs where.
func (w *world) dumpFlight(reason string) (string, error) {
	w.dumpMu.Lock()
	defer w.dumpMu.Unlock()
	rec := w.flightRecord(reason)
	var buf bytes.Buffer
	if err := writeFlightJSON(&buf, rec); err != nil {
		return "", err
	}
	dir := w.flightDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("comm: dumping the flight record: %w (set %s or comm.WithFlightDir to a writable directory)", err, launch.FlightDirEnv)
	}
	path := filepath.Join(dir, FlightFileName(rec.Rank))
	tmp, err := os.CreateTemp(dir, "."+FlightFileName(rec.Rank)+".*")
	if err != nil {
		return "", fmt.Errorf("comm: dumping the flight record: %w", err)
	}
	_, err = tmp.Write(buf.Bytes())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("comm: dumping the flight record to %s: %w", path, err)
	}
	w.logger.Warn("comm: flight record written; run `tandem debug "+dir+"` once every rank has written its own", "rank", rec.Rank, "path", path, "reason", reason)
	return path, nil
}

// flightFailed writes the abort's dump again, once, when the first
// operation to fail after the abort has recorded its error: the dump taken
// at the abort shows it still running. The first dump stays in place
// should the process end before (each dump replaces the file whole).
func (w *world) flightFailed() {
	reason := w.abortDump.Load()
	if reason == nil || !w.redumped.CompareAndSwap(false, true) {
		return
	}
	if _, err := w.dumpFlight(*reason); err != nil {
		w.logger.Warn("comm: could not dump the flight record", "err", err)
	}
}

// DumpOnSignal makes this process write the flight record of pg's world
// (see DumpFlightRecord) each time it receives SIGUSR1, until stop is
// called or the world ends. NewProcessGroup installs it by itself at
// DebugInfo and above. Where the system has no SIGUSR1 it does nothing.
func DumpOnSignal(pg *ProcessGroup) (stop func()) {
	return pg.world.dumpOnSignal()
}

func (w *world) dumpOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	if !notifyDump(ch) {
		return func() {}
	}
	done := make(chan struct{})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			stopDump(ch)
			close(done)
		})
	}
	go func() {
		for {
			select {
			case <-ch:
				if _, err := w.dumpFlight("SIGUSR1"); err != nil {
					w.logger.Warn("comm: SIGUSR1: could not dump the flight record", "err", err)
				}
			case <-done:
				return
			case <-w.life.Done():
				stop()
				return
			}
		}
	}()
	return stop
}
