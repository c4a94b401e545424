package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mrand "math/rand/v2"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/tcp"
	"github.com/tandemml/tandem/ddp"
	tlaunch "github.com/tandemml/tandem/launch"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// synthRecord is a rank's record with ops #0..done-1 done and, when
// pending, #done running since 10 ms after the last ended.
func synthRecord(rank, world, done int, pending bool, base time.Time) comm.FlightRecord {
	g := comm.FlightGroup{Name: "world", Rank: rank, Size: world, NextSeq: uint32(done)}
	for i := range world {
		g.Members = append(g.Members, i)
	}
	for i := range done {
		t := base.Add(time.Duration(i) * 10 * time.Millisecond)
		g.Ops = append(g.Ops, comm.FlightOp{Seq: uint32(i), Kind: "all_reduce", Desc: "all_reduce(float32,[1024],sum)", State: "done",
			Enqueued: t, Started: t, Ended: t.Add(time.Millisecond)})
	}
	if pending {
		t := base.Add(time.Duration(done) * 10 * time.Millisecond)
		g.Ops = append(g.Ops, comm.FlightOp{Seq: uint32(done), Kind: "all_reduce", Desc: "all_reduce(float32,[1024],sum)", State: "running",
			Enqueued: t, Started: t})
		g.NextSeq++
	}
	g.Recorded = uint64(len(g.Ops))
	return comm.FlightRecord{Version: 1, Rank: rank, WorldSize: world, PID: 100 + rank, Host: "node", Time: base.Add(time.Minute),
		Reason: "abort: test", Groups: []comm.FlightGroup{g}}
}

func writeRecords(t *testing.T, recs ...comm.FlightRecord) string {
	t.Helper()
	dir := t.TempDir()
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, comm.FlightFileName(r.Rank)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func debugReport(t *testing.T, paths ...string) string {
	t.Helper()
	recs, err := loadFlightRecords(paths)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeDebugReport(&out, recs, 3); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func mustContain(t *testing.T, out string, parts ...string) {
	t.Helper()
	flat := strings.Join(strings.Fields(out), " ")
	for _, p := range parts {
		if !strings.Contains(flat, p) {
			t.Errorf("report lacks %q:\n%s", p, out)
		}
	}
}

func TestDebugNamesLaggingRank(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dir := writeRecords(t, synthRecord(0, 3, 10, true, base), synthRecord(1, 3, 10, false, base), synthRecord(2, 3, 10, true, base))
	out := debugReport(t, dir)
	mustContain(t, out, `Group "world" (3 ranks): rank 1 did not reach operation #10, all_reduce (all_reduce(float32,[1024],sum)): ranks 0 and 2 entered it and waited for it since 03:04:05.100.`,
		"rank 1's last operation was #9 all_reduce, done at 03:04:05.091",
		"rank seq kind", "1 #9 all_reduce done")
	if strings.Contains(out, "no flight record") {
		t.Errorf("every rank wrote a record:\n%s", out)
	}
	t.Log("\n" + out)
}

func TestDebugNamesRankWithoutRecord(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r0, r2 := synthRecord(0, 3, 7, true, base), synthRecord(2, 3, 7, true, base)
	r0.PeerErrors = map[string]string{"1": "tandem: peer lost: tcp: rank 0: rank 1 is unresponsive: nothing received for 5s (since 03:04:05.050)"}
	dir := writeRecords(t, r0, r2)
	// Files named one by one work as a directory does.
	out := debugReport(t, filepath.Join(dir, "rank0.json"), filepath.Join(dir, "rank2.json"))
	mustContain(t, out, "2 of 3 ranks wrote flight records",
		"rank 1 did not reach operation #7, all_reduce", "ranks 0 and 2 entered it and waited for it since 03:04:05.070",
		"Rank 1 wrote no flight record", "About rank 1, rank 0: tandem: peer lost: tcp: rank 0: rank 1 is unresponsive",
		"1 - (no record)")
	t.Log("\n" + out)
}

// Every rank entered the operation and rank 1 stopped inside it: the
// others' transports found it unresponsive, and the report names it as
// the rank they wait on.
func TestDebugNamesRankWaitedOnInside(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recs := []comm.FlightRecord{synthRecord(0, 3, 6, true, base), synthRecord(1, 3, 6, true, base), synthRecord(2, 3, 6, true, base)}
	msg := "tandem: peer lost: shm: rank %d: rank 1 is unresponsive: nothing received for 5s (since 03:04:05.060)"
	recs[0].PeerErrors = map[string]string{"1": fmt.Sprintf(msg, 0)}
	// Rank 2 aborted a moment later, when rank 0 had gone too; rank 1,
	// resumed ten seconds on, found both gone.
	recs[2].Time = recs[0].Time.Add(50 * time.Millisecond)
	recs[2].PeerErrors = map[string]string{"1": fmt.Sprintf(msg, 2), "0": "tandem: peer lost: shm: rank 2: rank 0 closed the connection"}
	recs[1].Time = recs[0].Time.Add(10 * time.Second)
	recs[1].PeerErrors = map[string]string{"0": "tandem: peer lost: shm: rank 1: rank 0 closed the connection", "2": "tandem: peer lost: shm: rank 1: rank 2 closed the connection"}
	out := debugReport(t, writeRecords(t, recs...))
	mustContain(t, out, "every rank entered operation #6, all_reduce",
		"The others wait on rank 1 inside it: rank 0: tandem: peer lost: shm: rank 0: rank 1 is unresponsive")
	t.Log("\n" + out)

	// Rank 1 never dumped: its peers' word is enough.
	out = debugReport(t, writeRecords(t, recs[0], recs[2]))
	mustContain(t, out, "rank 1 did not reach operation #6", "About rank 1, rank 0:")

	// Without the peers' word nobody is named.
	recs[0].PeerErrors, recs[1].PeerErrors, recs[2].PeerErrors = nil, nil, nil
	if out := debugReport(t, writeRecords(t, recs...)); strings.Contains(out, "wait on") {
		t.Errorf("no peer error names a rank, yet:\n%s", out)
	}
}

func TestDebugNamesDisagreement(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recs := []comm.FlightRecord{synthRecord(0, 3, 8, true, base), synthRecord(1, 3, 8, true, base), synthRecord(2, 3, 8, true, base)}
	op := &recs[2].Groups[0].Ops[5]
	op.Kind, op.Desc = "broadcast", "broadcast(float32,[1024],root=0)"
	out := debugReport(t, writeRecords(t, recs...))
	mustContain(t, out, "the ranks disagree at operation #5: ranks 0 and 1 called all_reduce(float32,[1024],sum); rank 2 called broadcast(float32,[1024],root=0) (since 03:04:05.050)")
	t.Log("\n" + out)
}

func TestDebugHealthyAndLateRank(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	out := debugReport(t, writeRecords(t, synthRecord(0, 2, 4, false, base), synthRecord(1, 2, 4, false, base)))
	mustContain(t, out, `every rank finished every operation up to #3; nothing is stuck.`)
	// Every rank entered the stuck operation, one of them long after the
	// others: it is named.
	recs := []comm.FlightRecord{synthRecord(0, 3, 4, true, base), synthRecord(1, 3, 4, true, base), synthRecord(2, 3, 4, true, base)}
	late := &recs[1].Groups[0].Ops[4]
	late.Enqueued, late.Started = late.Started.Add(2*time.Second), late.Started.Add(2*time.Second)
	out = debugReport(t, writeRecords(t, recs...))
	mustContain(t, out, "every rank entered operation #4, all_reduce", "Rank 1 entered it last, at 03:04:07.040, 2s after rank 0")
}

func TestDebugRejectsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := loadFlightRecords([]string{dir}); err == nil || !strings.Contains(err.Error(), "no flight records") {
		t.Fatalf("empty directory: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "x.json"), []byte(`{"hello":1}`), 0o644)
	if _, err := loadFlightRecords([]string{dir}); err == nil || !strings.Contains(err.Error(), "not a flight record") {
		t.Fatalf("foreign JSON: %v", err)
	}
	if err := runDebug(context.Background(), nil); err == nil {
		t.Fatal("no arguments accepted")
	}
}

// debugRankEnv makes a re-executed test binary one rank of
// TestDebugFindsStoppedRank; its value is "STOREADDR RANK".
const debugRankEnv = "TANDEM_DEBUG_TEST_RANK"

// debugBackend is the TCP backend on loopback, for the ranks of these tests.
const debugBackend = "tcp-debug-loopback"

func init() { comm.Register(debugBackend, tcp.NewBackend(tcp.WithHost("127.0.0.1"))) }

// TestHelperDebugRank is not a test: it is one rank of
// TestDebugFindsStoppedRank, in a process of its own. It trains a small
// MLP with DDP and SGD until its group fails, and prints "ok N" after each
// step, N being the number of collectives the step brought it to.
func TestHelperDebugRank(t *testing.T) {
	v := os.Getenv(debugRankEnv)
	if v == "" {
		t.Skip("a rank of TestDebugFindsStoppedRank")
	}
	addr, rs, _ := strings.Cut(v, " ")
	rank, _ := strconv.Atoi(rs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false, store.WithToken("debug"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pg, err := comm.Init(ctx, "env://", comm.WithStore(st), comm.WithRank(rank), comm.WithWorldSize(3),
		comm.WithBackend(debugBackend), comm.WithToken("debug"), comm.WithoutDefault(),
		comm.WithGroupOptions(comm.WithTimeout(debugGroupTimeout)))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	sizes := []int{32, 64, 10}
	model, err := models.NewMLP(sizes, models.WithRand(mrand.New(mrand.NewPCG(0, 0))), models.WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	net, err := ddp.New(ctx, pg, model, ddp.StragglerEvery(5))
	if err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(0.01))
	if err != nil {
		t.Fatal(err)
	}
	rng := mrand.New(mrand.NewPCG(uint64(rank), 1))
	x := tensor.New(tensor.WithShape(16, sizes[0]), tensor.Of(tensor.Float32))
	for i := range x.Float32s() {
		x.Float32s()[i] = float32(rng.NormFloat64())
	}
	y := tensor.New(tensor.WithShape(16), tensor.Of(tensor.Int64))
	for {
		if _, err := net.Step(ctx, x, y); err != nil {
			fmt.Printf("failed %v\n", err)
			return
		}
		if err := opt.Step(); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("ok %d\n", pg.FlightRecord().Groups[0].NextSeq)
		time.Sleep(2 * time.Millisecond)
	}
}

// debugGroupTimeout is the ranks' operation timeout in
// TestDebugFindsStoppedRank: the survivors must have dumped within it.
const debugGroupTimeout = 20 * time.Second

// Three ranks train with DDP in processes of their own; one is stopped with SIGSTOP
// mid-training. Within the group's timeout both survivors have dumped
// their flight records (the stopped one cannot), and `tandem debug` on the
// directory names the stopped rank and the operation it did not reach.
// Resumed, the stopped rank finds its group gone and dumps its own view.
func TestDebugFindsStoppedRank(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("needs SIGSTOP")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken("debug"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	type child struct {
		cmd   *exec.Cmd
		mu    sync.Mutex
		lines []string
		done  chan struct{}
		ok    chan int // each "ok N"
	}
	kids := make([]*child, 3)
	for r := range 3 {
		c := &child{done: make(chan struct{}), ok: make(chan int, 1024)}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperDebugRank$", "-test.timeout=3m")
		c.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", debugRankEnv, srv.Addr(), r), tlaunch.FlightDirEnv+"="+dir,
			tlaunch.DebugEnv+"=OFF")
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		c.cmd.Stderr = io.Discard
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(c.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				c.mu.Lock()
				c.lines = append(c.lines, line)
				c.mu.Unlock()
				if n, err := strconv.Atoi(strings.TrimPrefix(line, "ok ")); err == nil {
					select {
					case c.ok <- n:
					default:
					}
				}
			}
		}()
		pid := c.cmd.Process.Pid
		t.Cleanup(func() {
			syscall.Kill(pid, syscall.SIGCONT)
			c.cmd.Process.Kill()
			c.cmd.Wait()
		})
		kids[r] = c
	}
	// Stop rank 1 once it is well into training.
	stopAfter := 40
	for n := 0; n < stopAfter; {
		select {
		case n = <-kids[1].ok:
		case <-ctx.Done():
			t.Fatalf("rank 1 never reached step %d: %v", stopAfter, kids[1].lines)
		}
	}
	if err := kids[1].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for _, r := range []int{0, 2} {
		select {
		case <-kids[r].done:
		case <-time.After(debugGroupTimeout + 10*time.Second):
			t.Fatalf("rank %d still runs %v after rank 1 was stopped", r, time.Since(stopped))
		}
		took := time.Since(stopped)
		kids[r].cmd.Wait()
		kids[r].mu.Lock()
		last := kids[r].lines[len(kids[r].lines)-1]
		kids[r].mu.Unlock()
		t.Logf("rank %d ended %v after the stop: %s", r, took.Round(10*time.Millisecond), last)
		if _, err := os.Stat(filepath.Join(dir, comm.FlightFileName(r))); err != nil {
			t.Fatalf("rank %d left no dump: %v", r, err)
		}
		if took > debugGroupTimeout {
			t.Errorf("rank %d dumped %v after the stop, beyond the group timeout %v", r, took, debugGroupTimeout)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, comm.FlightFileName(1))); err == nil {
		t.Fatal("the stopped rank dumped while stopped")
	}
	// Rank 1 finished steps up to collective N (ops #0..#N-1) before it
	// stopped; it may have gone on into the next step, doing its part of
	// a collective or two, so the survivors wait in #N, #N+1 or #N+2.
	kids[1].mu.Lock()
	lastOK := 0
	for _, l := range kids[1].lines {
		if n, err := strconv.Atoi(strings.TrimPrefix(l, "ok ")); err == nil {
			lastOK = n
		}
	}
	kids[1].mu.Unlock()
	out := debugReport(t, dir)
	t.Logf("rank 1 printed ok %d before it stopped; tandem debug says:\n%s", lastOK, out)
	m := regexp.MustCompile(`rank 1 did not reach operation #(\d+), (\w+)`).FindStringSubmatch(strings.Join(strings.Fields(out), " "))
	if m == nil {
		t.Fatalf("the report does not name rank 1 and the operation it did not reach")
	}
	seq, _ := strconv.Atoi(m[1])
	if seq < lastOK || seq > lastOK+2 {
		t.Errorf("the report names #%d; rank 1 had finished #0..#%d", seq, lastOK-1)
	}
	recs, err := loadFlightRecords([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	// Every survivor failed in the operation the report names, or in a
	// later one of rank 1's last step: a survivor whose part of #N rank 1
	// had done before it stopped finished #N and waits in the next.
	named, unresponsive := false, false
	for _, rec := range recs {
		// The survivors' records blame rank 1 alone: the other survivor
		// aborted and said so (PeerAborts), or was still up when the
		// record was taken. The survivor that found rank 1 unresponsive
		// first says so; the other may have aborted on its word before
		// its own check fired.
		if strings.Contains(rec.PeerErrors["1"], "rank 1 is unresponsive") {
			unresponsive = true
		}
		if other := strconv.Itoa(2 - rec.Rank); rec.PeerErrors[other] != "" {
			t.Errorf("rank %d's record blames rank %s, which aborted on its own: %q", rec.Rank, other, rec.PeerErrors[other])
		}
		ops := rec.Groups[0].Ops
		last := ops[len(ops)-1]
		if last.State != "failed" || last.Seq < uint32(seq) || last.Seq > uint32(lastOK+2) {
			t.Errorf("rank %d's last operation is #%d %s (%s), the report says #%d %s", rec.Rank, last.Seq, last.Kind, last.State, seq, m[2])
		}
		if last.Seq == uint32(seq) && last.Kind == m[2] {
			named = true
		}
	}
	if !named {
		t.Errorf("no survivor failed in #%d %s, the operation the report names", seq, m[2])
	}
	if !unresponsive {
		t.Errorf("no survivor's record says rank 1 is unresponsive: %v and %v", recs[0].PeerErrors, recs[1].PeerErrors)
	}
	mustContain(t, out, "2 of 3 ranks wrote flight records", "Rank 1 wrote no flight record", "About rank 1", "unresponsive",
		"The operation failed with: (rank 0)")

	// Resumed, rank 1 finds its peers gone, fails and dumps.
	if err := kids[1].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kids[1].done:
	case <-time.After(30 * time.Second):
		t.Fatal("rank 1 did not end after it was resumed")
	}
	kids[1].cmd.Wait()
	if _, err := os.Stat(filepath.Join(dir, comm.FlightFileName(1))); err != nil {
		t.Fatalf("resumed rank 1 left no dump: %v", err)
	}
	out = debugReport(t, dir)
	t.Logf("with rank 1's own record:\n%s", out)
	mustContain(t, out, "3 of 3 ranks wrote flight records")
	flat := strings.Join(strings.Fields(out), " ")
	// Rank 1 may have entered the operation and stopped inside it, after
	// its peers: then the report names it as the rank they wait on.
	if !strings.Contains(flat, "rank 1 did not reach operation #"+m[1]) && !strings.Contains(flat, "Rank 1 entered it last") &&
		!strings.Contains(flat, "The others wait on rank 1 inside it") {
		t.Errorf("with every record, the report no longer blames rank 1")
	}
}

// A receive whose message was never sent is named, with the peer's last
// send in that stream, when the collectives are fine; the sends and
// receives are listed with their streams' numbers.
func TestDebugNamesPendingReceive(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recs := []comm.FlightRecord{synthRecord(0, 2, 4, false, base), synthRecord(1, 2, 4, false, base)}
	p2p := func(kind string, seq uint32, peer int, state string, at time.Duration) comm.FlightOp {
		dir := "to"
		if kind == "recv" {
			dir = "from"
		}
		t := base.Add(at)
		op := comm.FlightOp{Seq: seq, Kind: kind, Desc: fmt.Sprintf("%s(float32,[8],%s=%d,tag=3)", kind, dir, peer), P2P: &comm.FlightP2P{Peer: peer, Tag: 3},
			State: state, Enqueued: t, Started: t}
		if state == "done" {
			op.Ended = t.Add(time.Millisecond)
		}
		return op
	}
	g0, g1 := &recs[0].Groups[0], &recs[1].Groups[0]
	g0.Ops = append(g0.Ops, p2p("send", 0, 1, "done", 100*time.Millisecond), p2p("send", 1, 1, "done", 110*time.Millisecond))
	g1.Ops = append(g1.Ops, p2p("recv", 0, 0, "done", 100*time.Millisecond), p2p("recv", 1, 0, "done", 110*time.Millisecond),
		p2p("recv", 2, 0, "running", 120*time.Millisecond))
	out := debugReport(t, writeRecords(t, recs...))
	mustContain(t, out, `Group "world" (2 ranks): the collectives are not held up, but rank 1's recv #2 from rank 0 under tag 3 (recv(float32,[8],from=0,tag=3)) is running since 03:04:05.120; rank 0 did not issue the matching send #2 (its last send to rank 1 under that tag was #1).`,
		"0 send#1 send done", "1 recv#2 recv running", "1 recv#1 recv done")
	// Both sides posted their operation: the report says so.
	g0.Ops = append(g0.Ops, p2p("send", 2, 1, "running", 130*time.Millisecond))
	out = debugReport(t, writeRecords(t, recs...))
	mustContain(t, out, "Rank 1's recv #2 from rank 0 under tag 3", "rank 0's matching send is running",
		"rank 0's send #2 to rank 1 under tag 3 (send(float32,[8],to=1,tag=3)) is running since 03:04:05.130; rank 1's matching recv is running")
	t.Log("\n" + out)
}
