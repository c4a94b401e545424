package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tandemml/tandem/comm"
)

func init() {
	commands["debug"] = command{summary: "explain a hang from the ranks' flight records: tandem debug FILES...|DIR", run: runDebug}
}

// runDebug is `tandem debug`: it reads the flight records that the ranks
// of a job dumped (on an abort, a timeout, a lost peer, SIGUSR1 or on
// request; see comm.FlightRecord), says in one paragraph per process group
// which rank did not reach which operation, or which ranks disagree, and
// since when, and which send or receive did not finish and whether the
// peer issued its match, and prints each rank's last operations.
func runDebug(_ context.Context, args []string) error {
	fs := commandFlags("debug", "usage: tandem debug [-n N] FILE...|DIR\n\nReads the flight records that the ranks dumped (rankR.json in $TANDEM_FLIGHT_DIR,\nor the directory their logs name) and says which rank held the others up.")
	last := fs.Int("n", 5, "operations to list per rank and group")
	files, err := parseFileArgs(fs, args, "the flight records or their directory")
	if err != nil {
		return err
	}
	recs, err := loadFlightRecords(files)
	if err != nil {
		return err
	}
	return writeDebugReport(os.Stdout, recs, *last)
}

// loadFlightRecords reads the files named, and the *.json files of the
// directories named.
func loadFlightRecords(paths []string) ([]comm.FlightRecord, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") && !strings.HasPrefix(e.Name(), ".") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no flight records (*.json) in %s", strings.Join(paths, ", "))
	}
	byRank := map[int]comm.FlightRecord{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var rec comm.FlightRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%s is not a flight record: %w", f, err)
		}
		if rec.Version == 0 || rec.WorldSize == 0 {
			return nil, fmt.Errorf("%s is not a flight record (no version or world size)", f)
		}
		if prev, ok := byRank[rec.Rank]; ok && !rec.Time.After(prev.Time) {
			continue // keep each rank's latest record
		}
		byRank[rec.Rank] = rec
	}
	recs := make([]comm.FlightRecord, 0, len(byRank))
	for _, r := range byRank {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Rank < recs[j].Rank })
	for _, r := range recs[1:] {
		if r.WorldSize != recs[0].WorldSize {
			return nil, fmt.Errorf("the records come from different jobs: rank %d's world has %d ranks, rank %d's %d",
				recs[0].Rank, recs[0].WorldSize, r.Rank, r.WorldSize)
		}
	}
	return recs, nil
}

// groupView is one process group as the ranks' records show it.
type groupView struct {
	name    string
	id      uint32
	members []int                     // world ranks
	byWorld map[int]*comm.FlightGroup // records present, by world rank: their collectives
	p2p     map[int][]comm.FlightOp   // their sends and receives, by world rank
	all     map[int][]comm.FlightOp   // every operation, in the order issued, by world rank
	peerErr map[int][]string          // world rank -> what the others said about it
	// blamedFirst: for each rank that another rank's record names as
	// failed before the rank's own record was taken (or with no record of
	// its own), the first such account: the ranks the others gave up on,
	// not those that had already aborted themselves when named.
	blamedFirst map[int]string
}

// groupViews collects the groups of the records, the world first.
func groupViews(recs []comm.FlightRecord) []*groupView {
	views := map[uint32]*groupView{}
	for i := range recs {
		rec := &recs[i]
		for gi := range rec.Groups {
			g := &rec.Groups[gi]
			v := views[g.ID]
			if v == nil {
				v = &groupView{name: g.Name, id: g.ID, members: g.Members, byWorld: map[int]*comm.FlightGroup{},
					p2p: map[int][]comm.FlightOp{}, all: map[int][]comm.FlightOp{}, peerErr: map[int][]string{}}
				views[g.ID] = v
			}
			// The collectives are numbered alike on every rank; sends and
			// receives by stream, matched apart.
			coll := *g
			coll.Ops = nil
			for _, op := range g.Ops {
				if op.P2P != nil {
					v.p2p[rec.Rank] = append(v.p2p[rec.Rank], op)
				} else {
					coll.Ops = append(coll.Ops, op)
				}
			}
			v.byWorld[rec.Rank] = &coll
			v.all[rec.Rank] = g.Ops
		}
	}
	out := make([]*groupView, 0, len(views))
	for _, v := range views {
		v.blamedFirst = map[int]string{}
		for i := range recs {
			for peer, msg := range recs[i].PeerErrors {
				p, err := strconv.Atoi(peer)
				if err != nil || !slices.Contains(v.members, p) {
					continue
				}
				say := fmt.Sprintf("rank %d: %s", recs[i].Rank, msg)
				v.peerErr[p] = append(v.peerErr[p], say)
				own := recTime(recs, p)
				if _, has := v.blamedFirst[p]; !has && (own.IsZero() || recs[i].Time.Before(own)) {
					v.blamedFirst[p] = say
				}
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// firstPending is the sequence number of the first operation that did not
// finish well in g (running, queued or failed), and whether there is one.
func firstPending(g *comm.FlightGroup) (comm.FlightOp, bool) {
	for _, op := range g.Ops {
		if op.State != "done" {
			return op, true
		}
	}
	return comm.FlightOp{}, false
}

func opAt(g *comm.FlightGroup, seq uint32) (comm.FlightOp, bool) {
	for _, op := range g.Ops {
		if op.Seq == seq {
			return op, true
		}
	}
	return comm.FlightOp{}, false
}

func clock(t time.Time) string { return t.Format("15:04:05.000") }

func rankList(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r)
	}
	switch len(s) {
	case 0:
		return "none"
	case 1:
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// diagnose says in one paragraph what went wrong in the group, or that
// nothing did; ok is false when it found a problem. Sends and receives
// that did not finish are named after the collectives' diagnosis.
func (v *groupView) diagnose() (para string, ok bool) {
	para, ok = v.diagnoseCollectives()
	if p2p := v.pendingP2P(); p2p != "" {
		if ok {
			para = fmt.Sprintf("Group %q (%d ranks): the collectives are not held up, but %s", v.name, len(v.members), p2p)
		} else {
			para += " Besides, " + p2p
		}
		return para, false
	}
	return para, ok
}

// pendingP2P describes the sends and receives that did not finish, each
// with what the peer's record says of its matching operation, or "".
func (v *groupView) pendingP2P() string {
	var parts []string
	for _, r := range v.members {
		for _, op := range v.p2p[r] {
			if op.State == "done" {
				continue
			}
			peer := op.P2P.Peer
			if peer >= 0 && peer < len(v.members) {
				peer = v.members[peer] // group rank to world rank
			}
			dir, match, mdir := "to", "recv", "from"
			if op.Kind == "recv" {
				dir, match, mdir = "from", "send", "to"
			}
			what := fmt.Sprintf("rank %d's %s #%d %s rank %d under tag %d (%s) is %s since %s", r, op.Kind, op.Seq, dir, peer, op.P2P.Tag, op.Desc, op.State, clock(startOf(op)))
			if op.State == "failed" && op.Error != "" {
				what = fmt.Sprintf("rank %d's %s #%d %s rank %d under tag %d (%s) failed at %s: %s", r, op.Kind, op.Seq, dir, peer, op.P2P.Tag, op.Desc, clock(endOf(op)), firstLine(op.Error))
			}
			switch theirs, last, has := v.matching(peer, r, match, op); {
			case !has:
				what += fmt.Sprintf("; rank %d left no record", peer)
			case theirs != nil:
				what += fmt.Sprintf("; rank %d's matching %s is %s", peer, match, theirs.State)
			case last >= 0:
				what += fmt.Sprintf("; rank %d did not issue the matching %s #%d (its last %s %s rank %d under that tag was #%d)", peer, match, op.Seq, match, mdir, r, last)
			default:
				what += fmt.Sprintf("; rank %d did not issue the matching %s #%d (it has no %s %s rank %d under that tag on record)", peer, match, op.Seq, match, mdir, r)
			}
			parts = append(parts, what)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	for i := 1; i < len(parts); i++ {
		parts[i] = capital(parts[i])
	}
	return strings.Join(parts, ". ") + "."
}

// matching finds, in world rank peer's record, the operation of kind
// that matches op of world rank r (the same number in the same stream,
// the other way), or else the number of the last of that stream it has
// (-1 if none); has is false when peer left no record.
func (v *groupView) matching(peer, r int, kind string, op comm.FlightOp) (m *comm.FlightOp, last int64, has bool) {
	if _, has = v.byWorld[peer]; !has {
		return nil, -1, false
	}
	gr := slices.Index(v.members, r) // r's rank in the group
	last = -1
	for i, o := range v.p2p[peer] {
		if o.Kind != kind || o.P2P.Peer != gr || o.P2P.Tag != op.P2P.Tag {
			continue
		}
		if o.Seq == op.Seq {
			return &v.p2p[peer][i], int64(o.Seq), true
		}
		last = max(last, int64(o.Seq))
	}
	return nil, last, true
}

// diagnoseCollectives is diagnose for the group's collectives.
func (v *groupView) diagnoseCollectives() (para string, ok bool) {
	label := fmt.Sprintf("Group %q (%d ranks)", v.name, len(v.members))
	var present, absent []int
	for _, r := range v.members {
		if _, has := v.byWorld[r]; has {
			present = append(present, r)
		} else {
			absent = append(absent, r)
		}
	}
	if len(present) == 0 {
		return "", true
	}
	// Disagreement: the first sequence number at which two ranks issued
	// different collectives.
	type pick struct {
		rank int
		op   comm.FlightOp
	}
	var seqs []uint32
	bySeq := map[uint32][]pick{}
	for _, r := range present {
		for _, op := range v.byWorld[r].Ops {
			if _, seen := bySeq[op.Seq]; !seen {
				seqs = append(seqs, op.Seq)
			}
			bySeq[op.Seq] = append(bySeq[op.Seq], pick{r, op})
		}
	}
	slices.Sort(seqs)
	for _, s := range seqs {
		ps := bySeq[s]
		groups := map[string][]int{}
		var order []string
		for _, p := range ps {
			if _, seen := groups[p.op.Desc]; !seen {
				order = append(order, p.op.Desc)
			}
			groups[p.op.Desc] = append(groups[p.op.Desc], p.rank)
		}
		if len(order) < 2 {
			continue
		}
		var parts []string
		since := ps[0].op.Enqueued
		for _, d := range order {
			parts = append(parts, fmt.Sprintf("%s called %s", rankList(groups[d]), d))
		}
		for _, p := range ps {
			if p.op.Enqueued.Before(since) {
				since = p.op.Enqueued
			}
		}
		return fmt.Sprintf("%s: the ranks disagree at operation #%d: %s (since %s). Every rank must issue the same collectives in the same order; find where their code paths part before #%d.",
			label, s, strings.Join(parts, "; "), clock(since), s), false
	}
	// The operation that the ranks present are held up in: the lowest
	// unfinished one.
	var stuck comm.FlightOp
	found := false
	for _, r := range present {
		if op, has := firstPending(v.byWorld[r]); has && (!found || op.Seq < stuck.Seq) {
			stuck, found = op, true
		}
	}
	if !found {
		var next uint32
		var maxNext uint32
		for i, r := range present {
			n := v.byWorld[r].NextSeq
			if i == 0 || n < next {
				next = n
			}
			maxNext = max(maxNext, n)
		}
		if len(absent) == 0 && next == maxNext {
			return fmt.Sprintf("%s: every rank finished every operation up to #%d; nothing is stuck.", label, int64(next)-1), true
		}
	}
	var entered, missed []int
	var waitSince time.Time
	var laggard []string
	for _, r := range present {
		g := v.byWorld[r]
		if op, has := opAt(g, stuck.Seq); has && found {
			entered = append(entered, r)
			if t := startOf(op); waitSince.IsZero() || t.Before(waitSince) {
				waitSince = t
			}
			continue
		}
		if found && g.NextSeq <= stuck.Seq {
			missed = append(missed, r)
			what := "no operation"
			if n := len(g.Ops); n > 0 {
				lastOp := g.Ops[n-1]
				what = fmt.Sprintf("#%d %s, %s at %s", lastOp.Seq, lastOp.Kind, lastOp.State, clock(endOf(lastOp)))
			}
			laggard = append(laggard, fmt.Sprintf("rank %d's last operation was %s", r, what))
		}
	}
	var b strings.Builder
	b.WriteString(label + ": ")
	blame := append(slices.Clone(missed), absent...)
	slices.Sort(blame)
	switch {
	case found && len(blame) > 0:
		fmt.Fprintf(&b, "%s did not reach operation #%d, %s (%s): %s entered it",
			rankList(blame), stuck.Seq, stuck.Kind, stuck.Desc, rankList(entered))
		if !waitSince.IsZero() {
			fmt.Fprintf(&b, " and waited for it since %s", clock(waitSince))
		}
		b.WriteString(".")
	case found:
		fmt.Fprintf(&b, "every rank entered operation #%d, %s (%s), and it did not finish on %s; they waited in it since %s.",
			stuck.Seq, stuck.Kind, stuck.Desc, rankList(unfinished(v, present, stuck.Seq)), clock(waitSince))
		first, lastR, lastT := -1, -1, time.Time{}
		for _, r := range entered {
			op, _ := opAt(v.byWorld[r], stuck.Seq)
			if t := startOf(op); lastR < 0 || t.After(lastT) {
				lastR, lastT = r, t
			}
			if t := startOf(op); first < 0 && t.Equal(waitSince) {
				first = r
			}
		}
		if d := lastT.Sub(waitSince); d >= lateEntry && lastR != first {
			fmt.Fprintf(&b, " Rank %d entered it last, at %s, %v after rank %d: it held the others up.", lastR, clock(lastT), d.Round(time.Millisecond), first)
		}
		if on := v.waitedOn(entered); len(on) > 0 {
			fmt.Fprintf(&b, " The others wait on %s inside it: %s.", rankList(on), strings.TrimSuffix(v.blamedFirst[on[0]], "."))
		}
	default:
		fmt.Fprintf(&b, "%s left no record; the others finished every operation they issued.", rankList(absent))
	}
	if len(laggard) > 0 {
		fmt.Fprintf(&b, " %s.", strings.Join(laggard, "; "))
	}
	if len(absent) > 0 {
		fmt.Fprintf(&b, " %s wrote no flight record: stopped, killed, or hung where it could not dump (send it SIGUSR1 to get its view, if it still runs)", capital(rankList(absent)))
		b.WriteString(".")
	}
	for _, r := range blame {
		if msgs := v.peerErr[r]; len(msgs) > 0 {
			fmt.Fprintf(&b, " About rank %d, %s.", r, msgs[0])
		}
	}
	if found {
		if e := firstError(v, present, stuck.Seq); e != "" {
			fmt.Fprintf(&b, " The operation failed with: %s", e)
			if !strings.HasSuffix(e, ".") {
				b.WriteString(".")
			}
		}
	}
	return b.String(), false
}

// waitedOn is the ranks among entered that others named as failed before
// those ranks' own records were taken (blamedFirst): inside an operation
// every rank entered, the ones the others waited on. A rank that stopped
// inside it and came back later finds the others gone and names them in
// turn, but only after their records were taken.
func (v *groupView) waitedOn(entered []int) []int {
	var on []int
	for _, r := range entered {
		if _, has := v.blamedFirst[r]; has {
			on = append(on, r)
		}
	}
	return on
}

// lateEntry is how much later than the first rank a rank must enter the
// stuck operation to be named as the one that held the others up.
const lateEntry = 100 * time.Millisecond

// capital makes s start a sentence.
func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func startOf(op comm.FlightOp) time.Time {
	if !op.Started.IsZero() {
		return op.Started
	}
	return op.Enqueued
}

func endOf(op comm.FlightOp) time.Time {
	if !op.Ended.IsZero() {
		return op.Ended
	}
	return startOf(op)
}

func unfinished(v *groupView, ranks []int, seq uint32) []int {
	var out []int
	for _, r := range ranks {
		if op, has := opAt(v.byWorld[r], seq); has && op.State != "done" {
			out = append(out, r)
		}
	}
	return out
}

func firstError(v *groupView, ranks []int, seq uint32) string {
	for _, r := range ranks {
		if op, has := opAt(v.byWorld[r], seq); has && op.Error != "" {
			return fmt.Sprintf("(rank %d) %s", r, op.Error)
		}
	}
	return ""
}

// writeDebugReport writes the diagnosis of every group, then each rank's
// last operations per group.
func writeDebugReport(w io.Writer, recs []comm.FlightRecord, last int) error {
	if len(recs) == 0 {
		return errors.New("no flight records")
	}
	world := recs[0].WorldSize
	var ranks []string
	for _, r := range recs {
		ranks = append(ranks, fmt.Sprintf("rank %d (pid %d on %s, %s: %s)", r.Rank, r.PID, r.Host, clock(r.Time), firstLine(r.Reason)))
	}
	fmt.Fprintf(w, "%d of %d ranks wrote flight records:\n  %s\n\n", len(recs), world, strings.Join(ranks, "\n  "))
	views := groupViews(recs)
	healthy := 0
	for _, v := range views {
		para, ok := v.diagnose()
		if ok {
			healthy++
			if v.id != 0 {
				continue
			}
		}
		if para != "" {
			fmt.Fprintln(w, wrap(para, 100))
			fmt.Fprintln(w)
		}
	}
	for _, v := range views {
		fmt.Fprintf(w, "group %q, last %d operations per rank:\n", v.name, last)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "rank\tseq\tkind\tstate\tenqueued\ttook\tfingerprint")
		for _, r := range v.members {
			_, has := v.byWorld[r]
			if !has {
				fmt.Fprintf(tw, "%d\t-\t(no record)\t\t\t\t\n", r)
				continue
			}
			ops := v.all[r][max(0, len(v.all[r])-last):]
			if len(ops) == 0 {
				fmt.Fprintf(tw, "%d\t-\t(no operations)\t\t\t\t\n", r)
			}
			for _, op := range ops {
				took := "-"
				switch {
				case !op.Ended.IsZero():
					took = roundDur(op.Ended.Sub(startOf(op))).String()
				case op.State == "running":
					took = "running " + recTime(recs, r).Sub(startOf(op)).Round(time.Millisecond).String()
				}
				seq := fmt.Sprintf("#%d", op.Seq)
				if op.P2P != nil {
					seq = fmt.Sprintf("%s#%d", op.Kind, op.Seq) // its stream's number
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r, seq, op.Kind, op.State, clock(op.Enqueued), took, op.Desc)
			}
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	return nil
}

// roundDur keeps about four significant digits.
func roundDur(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

func recTime(recs []comm.FlightRecord, rank int) time.Time {
	for _, r := range recs {
		if r.Rank == rank {
			return r.Time
		}
	}
	return time.Time{}
}

func firstLine(s string) string {
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// wrap breaks s into lines of at most width characters at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(s) {
		if i > 0 && n+1+len(word) > width {
			b.WriteByte('\n')
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}
