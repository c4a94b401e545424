package comm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/launch"
	"gorgonia.org/tensor"
)

// flightWorld makes n ranks over local transports, each with opts.
func flightWorld(t testing.TB, n int, opts ...comm.Option) []*comm.ProcessGroup {
	t.Helper()
	ts, err := local.NewTransports(n)
	if err != nil {
		t.Fatal(err)
	}
	pgs := make([]*comm.ProcessGroup, n)
	for r := range n {
		pgs[r], err = comm.NewProcessGroup(context.Background(), ts[r], opts...)
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			wg.Add(1)
			go func() { defer wg.Done(); pg.Close() }()
		}
		wg.Wait()
	})
	return pgs
}

// onEach runs fn on every rank concurrently and fails on any rank's error.
func onEach(t testing.TB, pgs []*comm.ProcessGroup, fn func(r int, pg *comm.ProcessGroup) error) {
	t.Helper()
	testkit.RequireEachRank(t, len(pgs), func(r int) error { return fn(r, pgs[r]) })
}

// The ring keeps the last N operations, oldest first, with their sequence
// numbers, kinds, fingerprints, states and times.
func TestFlightRecordKeepsTheLastOps(t *testing.T) {
	pgs := flightWorld(t, 3, comm.WithFlightRecorder(8), comm.WithFlightDir(t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		x := tensor.New(tensor.WithShape(4), tensor.Of(tensor.Float32))
		for range 12 {
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		return pg.Barrier(ctx).Wait(ctx)
	})
	rec := pgs[1].FlightRecord()
	if rec.Rank != 1 || rec.WorldSize != 3 || rec.PID != os.Getpid() || rec.Version != 1 {
		t.Fatalf("header: %+v", rec)
	}
	if len(rec.Groups) != 1 {
		t.Fatalf("%d groups, want the world", len(rec.Groups))
	}
	g := rec.Groups[0]
	if g.Name != "world" || g.Size != 3 || g.Rank != 1 || g.NextSeq != 13 || g.Recorded != 13 || len(g.Ops) != 8 {
		t.Fatalf("group: name %q size %d rank %d next %d recorded %d ops %d", g.Name, g.Size, g.Rank, g.NextSeq, g.Recorded, len(g.Ops))
	}
	for i, op := range g.Ops {
		if op.Seq != uint32(5+i) || op.State != "done" || op.Error != "" {
			t.Fatalf("op %d: %+v", i, op)
		}
		if op.Enqueued.IsZero() || op.Started.Before(op.Enqueued) || op.Ended.Before(op.Started) {
			t.Fatalf("op %d times out of order: %+v", i, op)
		}
		if len(op.Stack) != 0 {
			t.Fatalf("op %d has a stack below DETAIL", i)
		}
	}
	if last := g.Ops[7]; last.Kind != "barrier" || last.Desc != "barrier()" {
		t.Fatalf("last op %+v, want the barrier", last)
	}
	if op := g.Ops[0]; op.Kind != "all_reduce" || op.Desc != "all_reduce(float32,[4],sum)" {
		t.Fatalf("first op %+v", op)
	}
	var buf bytes.Buffer
	if err := pgs[1].WriteFlightRecord(&buf); err != nil {
		t.Fatal(err)
	}
	var back comm.FlightRecord
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Groups) != 1 || len(back.Groups[0].Ops) != 8 || !back.Groups[0].Ops[3].Ended.Equal(g.Ops[3].Ended) {
		t.Fatalf("the JSON does not read back: %+v", back)
	}
	// Subgroups have their own ring and appear in the same record.
	var subs = make([]*comm.ProcessGroup, 3)
	onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		var err error
		subs[r], err = pg.NewGroup(ctx, []int{0, 2}, comm.WithName("pair"))
		if err != nil || r == 1 {
			return err
		}
		x := tensor.New(tensor.WithShape(2), tensor.Of(tensor.Int64))
		return subs[r].AllReduce(ctx, x, comm.Max).Wait(ctx)
	})
	rec = pgs[2].FlightRecord()
	if len(rec.Groups) != 2 || rec.Groups[1].Name != "pair" || rec.Groups[1].Rank != 1 || len(rec.Groups[1].Ops) != 1 ||
		rec.Groups[1].Ops[0].Desc != "all_reduce(int64,[2],max)" {
		t.Fatalf("subgroup record: %+v", rec.Groups)
	}
	if got := len(pgs[1].FlightRecord().Groups); got != 1 {
		t.Fatalf("rank 1 is not in the pair, but its record has %d groups", got)
	}
	subs[0].Close()
	subs[2].Close()
	if got := len(pgs[2].FlightRecord().Groups); got != 1 {
		t.Fatalf("a closed subgroup stays in the record: %d groups", got)
	}
}

// A collective that times out aborts the world, and each rank that was in
// it dumps its record to its own file, with the ones before it done and
// the stuck one failed, with its error.
func TestFlightDumpOnTimeout(t *testing.T) {
	dir := t.TempDir()
	pgs := flightWorld(t, 3, comm.WithFlightDir(dir))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		x := tensor.New(tensor.WithShape(16), tensor.Of(tensor.Float64))
		for range 3 {
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		if r == 2 {
			return nil // rank 2 goes no further
		}
		short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		defer stop()
		err := pg.Broadcast(short, x, 0).Wait(ctx)
		if !errors.Is(err, comm.ErrTimeout) {
			return errors.New("want a timeout, got " + errString(err))
		}
		return nil
	})
	for _, r := range []int{0, 1} {
		b, err := os.ReadFile(filepath.Join(dir, comm.FlightFileName(r)))
		if err != nil {
			t.Fatalf("rank %d did not dump: %v", r, err)
		}
		var rec comm.FlightRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		ops := rec.Groups[0].Ops
		if rec.Rank != r || len(ops) != 4 || !strings.HasPrefix(rec.Reason, "abort: ") || !strings.Contains(rec.Reason, "broadcast") {
			t.Fatalf("rank %d's dump: reason %q, %d ops", r, rec.Reason, len(ops))
		}
		// Written again once the broadcast recorded its error.
		if ops[2].State != "done" || ops[3].Seq != 3 || ops[3].Kind != "broadcast" || ops[3].State != "failed" || !strings.Contains(ops[3].Error, "broadcast") {
			t.Fatalf("rank %d's ops: %+v", r, ops)
		}
	}
	// Rank 2's world was aborted by its peers only when it next
	// communicates; it did not dump (its own operations all succeeded).
	if _, err := os.Stat(filepath.Join(dir, comm.FlightFileName(2))); err == nil {
		t.Fatalf("rank 2 dumped although nothing failed on it")
	}
	// Dumps on request go to the same place.
	path, err := pgs[2].DumpFlightRecord()
	if err != nil || path != filepath.Join(dir, "rank2.json") {
		t.Fatalf("DumpFlightRecord: %q, %v", path, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// At DETAIL the record keeps the stack that issued each collective, the
// group's creation and every collective are logged; at INFO only the
// creation.
func TestDebugLevels(t *testing.T) {
	for _, lvl := range []launch.DebugLevel{launch.DebugOff, launch.DebugInfo, launch.DebugDetail} {
		t.Run(lvl.String(), func(t *testing.T) {
			var mu sync.Mutex
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
			pgs := flightWorld(t, 2, comm.WithDebugLevel(lvl), comm.WithLogger(log), comm.WithFlightDir(t.TempDir()))
			if pgs[0].DebugLevel() != lvl {
				t.Fatalf("DebugLevel() = %v", pgs[0].DebugLevel())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				x := tensor.New(tensor.WithShape(3), tensor.Of(tensor.Float32))
				return issueAllReduce(ctx, pg, x)
			})
			mu.Lock()
			out := logs.String()
			mu.Unlock()
			created := strings.Count(out, "comm: process group created")
			collectives := strings.Count(out, `msg="comm: collective"`)
			op := pgs[0].FlightRecord().Groups[0].Ops[0]
			hasStack := len(op.Stack) > 1 && strings.Contains(op.Stack[0], "AllReduce") && strings.Contains(op.Stack[1], "issueAllReduce")
			switch lvl {
			case launch.DebugOff:
				if created+collectives != 0 || len(op.Stack) != 0 {
					t.Fatalf("OFF logged %q, stack %v", out, op.Stack)
				}
			case launch.DebugInfo:
				if created != 2 || collectives != 0 || len(op.Stack) != 0 {
					t.Fatalf("INFO logged %q, stack %v", out, op.Stack)
				}
			case launch.DebugDetail:
				if created != 2 || collectives != 2 || !hasStack || !strings.Contains(out, "all_reduce(float32,[3],sum)") {
					t.Fatalf("DETAIL logged %q, stack %v", out, op.Stack)
				}
			}
		})
	}
}

// issueAllReduce is a named caller for the stack at DETAIL.
//
//go:noinline
func issueAllReduce(ctx context.Context, pg *comm.ProcessGroup, x *tensor.Dense) error {
	return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// TANDEM_DEBUG and TORCH_DISTRIBUTED_DEBUG set the level of groups made
// without WithDebugLevel; a bad value fails NewProcessGroup and names the
// variable.
func TestDebugLevelFromEnv(t *testing.T) {
	t.Setenv(launch.TorchDebugEnv, "detail")
	t.Setenv(launch.FlightDirEnv, t.TempDir())
	pgs := flightWorld(t, 1)
	if pgs[0].DebugLevel() != launch.DebugDetail {
		t.Fatalf("TORCH_DISTRIBUTED_DEBUG=detail gave %v", pgs[0].DebugLevel())
	}
	t.Setenv(launch.DebugEnv, "INFO") // wins over PyTorch's spelling
	pgs = flightWorld(t, 1)
	if pgs[0].DebugLevel() != launch.DebugInfo {
		t.Fatalf("TANDEM_DEBUG=INFO gave %v", pgs[0].DebugLevel())
	}
	t.Setenv(launch.DebugEnv, "LOUD")
	ts, err := local.NewTransports(1)
	if err != nil {
		t.Fatal(err)
	}
	defer ts[0].Close()
	_, err = comm.NewProcessGroup(context.Background(), ts[0])
	if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "TANDEM_DEBUG") {
		t.Fatalf("TANDEM_DEBUG=LOUD: %v", err)
	}
}

// DumpOnSignal writes the record when the process receives SIGUSR1.
func TestDumpOnSignal(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no SIGUSR1")
	}
	dir := t.TempDir()
	pgs := flightWorld(t, 1, comm.WithFlightDir(dir))
	stop := comm.DumpOnSignal(pgs[0])
	defer stop()
	if err := pgs[0].Barrier(context.Background()).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, comm.FlightFileName(0))
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var rec comm.FlightRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Reason != "SIGUSR1" || len(rec.Groups[0].Ops) != 1 {
			t.Fatalf("dump: %+v", rec)
		}
		return
	}
	t.Fatal("no dump 10 s after SIGUSR1")
}

// Three ranks report their step times; the one whose steps take three
// times as long is named the straggler, by rank and factor, on every rank.
func TestStepTimerNamesStraggler(t *testing.T) {
	pgs := flightWorld(t, 3, comm.WithFlightDir(t.TempDir()))
	var mu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make([]comm.StepTimes, 3)
	onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		st := comm.NewStepTimer(pg, comm.StragglerEvery(4), comm.StragglerLog(log, time.Hour))
		for i := range 8 {
			d := 10 * time.Millisecond
			if r == 1 {
				d = 30 * time.Millisecond
			}
			times, exchanged, err := st.Observe(ctx, d+time.Duration(i)*time.Microsecond)
			if err != nil {
				return err
			}
			if exchanged != (i%4 == 3) {
				return errors.New("exchanged at the wrong step")
			}
			if exchanged {
				got[r] = times
			}
		}
		if l := st.Last(); l.Step != 8 {
			return errors.New("Last is not the last exchange")
		}
		return nil
	})
	for r, s := range got {
		if s.Slowest != 1 || s.Factor < 2.9 || s.Factor > 3.1 || s.Window != 4 || s.Step != 8 || len(s.Times) != 3 {
			t.Fatalf("rank %d learned %v", r, s)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "straggler: rank 1 is slowest"); n != 1 {
		t.Fatalf("want one log line (rank 0's, rate-limited), got %d:\n%s", n, logs.String())
	}
	t.Log(got[0])
}

// The flight recorder's cost on the hot path: a 4 KiB all-reduce between
// two ranks with the recorder off, at its default and at DETAIL (which
// takes a stack per operation).
func BenchmarkFlightRecorder(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []comm.Option
	}{
		{"off", []comm.Option{comm.WithFlightRecorder(0)}},
		{"default", nil},
		{"detail", []comm.Option{comm.WithDebugLevel(launch.DebugDetail), comm.WithLogger(slog.New(slog.DiscardHandler))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			pgs := flightWorld(b, 2, append([]comm.Option{comm.WithFlightDir(b.TempDir())}, c.opts...)...)
			ctx := context.Background()
			xs := []*tensor.Dense{tensor.New(tensor.WithShape(1024), tensor.Of(tensor.Float32)), tensor.New(tensor.WithShape(1024), tensor.Of(tensor.Float32))}
			done := make(chan error, 1)
			b.ReportAllocs()
			b.SetBytes(4096)
			b.ResetTimer()
			go func() {
				for range b.N {
					if err := pgs[1].AllReduce(ctx, xs[1], comm.Sum).Wait(ctx); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := pgs[0].AllReduce(ctx, xs[0], comm.Sum).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// Sends and receives are in the flight record beside the collectives, each
// numbered in its stream (peer, tag, direction) so that send n on one rank
// matches receive n on the other, with its peer, tag, fingerprint and
// state; a receive whose message never comes is left failed. The
// collectives keep their own sequence numbers. At DETAIL each is logged
// and keeps the stack that issued it.
func TestFlightRecordsPointToPoint(t *testing.T) {
	var mu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
	pgs := flightWorld(t, 2, comm.WithFlightDir(t.TempDir()), comm.WithDebugLevel(launch.DebugDetail), comm.WithLogger(log))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	onEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		x := tensor.New(tensor.WithShape(4), tensor.Of(tensor.Float32))
		if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
			return err
		}
		for range 3 {
			var err error
			if r == 0 {
				err = issueSend(ctx, pg, x, 1, 5)
			} else {
				err = pg.Recv(ctx, x, 0, 5)
			}
			if err != nil {
				return err
			}
		}
		if r == 1 {
			// Rank 0 never sends under tag 7.
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if err := pg.Recv(short, x, 0, 7); !errors.Is(err, comm.ErrTimeout) {
				return errors.New("a receive of a message never sent did not time out")
			}
		}
		return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
	})
	for r, pg := range pgs {
		g := pg.FlightRecord().Groups[0]
		if g.NextSeq != 2 {
			t.Errorf("rank %d: next collective #%d, want #2: sends and receives take no collective numbers", r, g.NextSeq)
		}
		var collectives []uint32
		var p2p []comm.FlightOp
		for i, op := range g.Ops {
			if op.Ord != uint64(i+1) {
				t.Errorf("rank %d: record %d has ordinal %d", r, i, op.Ord)
			}
			if op.P2P == nil {
				collectives = append(collectives, op.Seq)
				continue
			}
			p2p = append(p2p, op)
		}
		if len(collectives) != 2 || collectives[0] != 0 || collectives[1] != 1 {
			t.Errorf("rank %d: collectives %v, want #0 and #1", r, collectives)
		}
		want := 3
		if r == 1 {
			want = 4
		}
		if len(p2p) != want {
			t.Fatalf("rank %d: %d point-to-point records, want %d: %+v", r, len(p2p), want, p2p)
		}
		for i, op := range p2p[:3] {
			kind, peer, desc := "send", 1, "send(float32,[4],to=1,tag=5)"
			if r == 1 {
				kind, peer, desc = "recv", 0, "recv(float32,[4],from=0,tag=5)"
			}
			if op.Kind != kind || op.Seq != uint32(i) || *op.P2P != (comm.FlightP2P{Peer: peer, Tag: 5}) || op.Desc != desc || op.State != "done" ||
				op.Started.Before(op.Enqueued) || op.Ended.Before(op.Started) {
				t.Errorf("rank %d: point-to-point record %d: %+v, want %s #%d with peer %d, tag 5, %s, done", r, i, op, kind, i, peer, desc)
			}
			if r == 0 && (len(op.Stack) < 2 || !strings.Contains(op.Stack[0], "comm.(*ProcessGroup).ISend") || !strings.Contains(strings.Join(op.Stack, "\n"), "issueSend")) {
				t.Errorf("rank 0: send %d's stack %q, want ISend called from issueSend", i, op.Stack)
			}
		}
		if r == 1 {
			op := p2p[3]
			if op.Kind != "recv" || op.Seq != 0 || op.P2P.Tag != 7 || op.State != "failed" || !strings.Contains(op.Error, "timed out") && !strings.Contains(op.Error, "timeout") {
				t.Errorf("rank 1: the receive under tag 7: %+v, want recv #0, failed with a timeout", op)
			}
		}
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if n := strings.Count(out, `msg="comm: point-to-point"`); n != 7 {
		t.Errorf("%d point-to-point log lines at DETAIL, want 7:\n%s", n, out)
	}
}

// issueSend is a named caller for the stack at DETAIL.
//
//go:noinline
func issueSend(ctx context.Context, pg *comm.ProcessGroup, x *tensor.Dense, dst, tag int) error {
	return pg.Send(ctx, x, dst, tag)
}
