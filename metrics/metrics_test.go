package metrics_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/launch"
	"github.com/tandemml/tandem/metrics"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// scrape fetches addr's endpoint and parses it with the client library's
// own text parser.
func scrape(t *testing.T, ctx context.Context, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+metrics.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scraping %s: %s: %s", addr, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("scraping %s: content type %q, want the text format", addr, ct)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the scrape of %s: %v", addr, err)
	}
	return fams
}

// value returns the value of the family's metric whose labels include
// want, failing the test when there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric family %s in the scrape", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s with labels %v in the scrape", name, want)
	return nil
}

func num(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return -1
}

const steps = 3

// trainRank builds a DDP over a small MLP on pg, takes a few steps and
// reduces two coalesced tensors (4*(2+3*4) = 56 bytes each).
func trainRank(ctx context.Context, pg *comm.ProcessGroup) (*ddp.DDP, error) {
	rng := rand.New(rand.NewPCG(uint64(pg.Rank()), 1))
	model, err := models.NewMLP([]int{8, 16, 3}, models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		return nil, err
	}
	net, err := ddp.New(ctx, pg, model, ddp.BucketCapMB(0.0003))
	if err != nil {
		return nil, err
	}
	for step := range steps {
		r := rand.New(rand.NewPCG(uint64(pg.Rank()), uint64(step)))
		x := make([]float64, 4*8)
		for i := range x {
			x[i] = r.NormFloat64()
		}
		y := []int64{int64(r.IntN(3)), int64(r.IntN(3)), int64(r.IntN(3)), int64(r.IntN(3))}
		if _, err := net.Step(ctx, tensor.New(tensor.WithShape(4, 8), tensor.WithBacking(x)),
			tensor.New(tensor.WithShape(4), tensor.WithBacking(y))); err != nil {
			return nil, err
		}
	}
	for range 2 {
		ts := []*tensor.Dense{tensor.New(tensor.WithShape(2), tensor.Of(tensor.Float32)), tensor.New(tensor.WithShape(3, 4), tensor.Of(tensor.Float32))}
		if err := pg.AllReduceCoalesced(ctx, ts, comm.Sum).Wait(ctx); err != nil {
			return nil, err
		}
	}
	// An object collective, whose steps name their sizes.
	if _, err := comm.AllGatherObject(ctx, pg, fmt.Sprintf("rank %d", pg.Rank())); err != nil {
		return nil, err
	}
	return net, nil
}

func TestEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const world = 2
	pgs, err := local.NewGroups(ctx, world)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()

	// An RPC agent pair beside the training: rank 0 calls rank 1.
	reg := rpc.NewRegistry()
	rpc.Register(reg, "add", func(ctx context.Context, p [2]int) (int, error) { return p[0] + p[1], nil })
	st := store.NewMemory()
	agents := make([]*rpc.Agent, world)
	errc := make(chan error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			agents[r], err = rpc.Init(ctx, fmt.Sprintf("worker%d", r), r, world, rpc.WithStore(st), rpc.WithRegistry(reg))
			errc <- err
		}()
	}
	wg.Wait()
	for range world {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() { defer wg.Done(); a.Shutdown(context.Background()) }()
		}
		wg.Wait()
	}()
	const calls = 5
	for i := range calls {
		if v, err := rpc.Sync[int](ctx, agents[0], "worker1", "add", [2]int{i, 1}); err != nil || v != i+1 {
			t.Fatalf("call %d: %v, %v", i, v, err)
		}
	}

	nets := make([]*ddp.DDP, world)
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			nets[r], err = trainRank(ctx, pgs[r])
			errc <- err
		}()
	}
	wg.Wait()
	for range world {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}

	// One endpoint per rank, as each process of a job serves its own.
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	addrs := make([]string, world)
	for r := range world {
		addrs[r], err = metrics.Serve(sctx, "127.0.0.1:0", metrics.Group(pgs[r]), metrics.DDP(nets[r]),
			metrics.RPC(agents[r]), metrics.Restarts(launch.Job{RestartCount: 2}))
		if err != nil {
			t.Fatal(err)
		}
	}

	for r := range world {
		fams := scrape(t, ctx, addrs[r])
		// Collectives: the same count of all_reduce as the flight
		// recorder holds; the coalesced ones exactly, bytes included.
		var allReduce float64
		for _, g := range pgs[r].FlightRecord().Groups {
			for _, op := range g.Ops {
				if op.Kind == "all_reduce" && op.State == "done" {
					allReduce++
				}
			}
		}
		if allReduce < steps {
			t.Fatalf("rank %d: the flight recorder holds %v all_reduce, want at least one a step", r, allReduce)
		}
		ar := map[string]string{"kind": "all_reduce"}
		if got := num(value(t, fams, "tandem_collectives_total", map[string]string{"kind": "all_reduce", "state": "done"})); got != allReduce {
			t.Errorf("rank %d: tandem_collectives_total{all_reduce,done} = %v, want %v", r, got, allReduce)
		}
		if h := value(t, fams, "tandem_collective_duration_seconds", ar).GetHistogram(); h.GetSampleCount() != uint64(allReduce) || h.GetSampleSum() <= 0 {
			t.Errorf("rank %d: all_reduce latency histogram has %d samples summing to %v, want %v and more than 0", r, h.GetSampleCount(), h.GetSampleSum(), allReduce)
		}
		co := map[string]string{"kind": "all_reduce_coalesced"}
		if got := num(value(t, fams, "tandem_collectives_total", map[string]string{"kind": "all_reduce_coalesced", "state": "done"})); got != 2 {
			t.Errorf("rank %d: %v all_reduce_coalesced counted, want 2", r, got)
		}
		if got := num(value(t, fams, "tandem_collective_bytes_total", co)); got != 2*56 {
			t.Errorf("rank %d: all_reduce_coalesced bytes %v, want 112", r, got)
		}
		if h := value(t, fams, "tandem_collective_bytes", co).GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() != 112 {
			t.Errorf("rank %d: all_reduce_coalesced size histogram %d samples summing to %v, want 2 and 112", r, h.GetSampleCount(), h.GetSampleSum())
		}
		if got := num(value(t, fams, "tandem_collective_ops_recorded_total", nil)); got < allReduce+2 {
			t.Errorf("rank %d: %v collectives recorded, want at least %v", r, got, allReduce+2)
		}

		// Object collectives: counted by kind without their sizes.
		for _, m := range fams["tandem_collectives_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && strings.ContainsAny(l.GetValue(), "(,") {
					t.Errorf("rank %d: kind label %q has arguments", r, l.GetValue())
				}
			}
		}
		if got := num(value(t, fams, "tandem_collective_bytes_total", map[string]string{"kind": "all_gather_object_payload"})); got <= 0 {
			t.Errorf("rank %d: all_gather_object_payload bytes %v, want more than 0", r, got)
		}

		// DDP.
		s := nets[r].Stats()
		if got := num(value(t, fams, "tandem_ddp_steps_total", map[string]string{"kind": "sync"})); got != steps {
			t.Errorf("rank %d: tandem_ddp_steps_total{sync} = %v, want %d", r, got, steps)
		}
		if got := num(value(t, fams, "tandem_ddp_buckets_reduced_total", nil)); got != float64(s.BucketsReduced) || got < steps {
			t.Errorf("rank %d: tandem_ddp_buckets_reduced_total = %v, want %d (at least %d)", r, got, s.BucketsReduced, steps)
		}
		if got := num(value(t, fams, "tandem_ddp_bytes_sent_total", nil)); got != float64(s.BytesSent) || got <= 0 {
			t.Errorf("rank %d: tandem_ddp_bytes_sent_total = %v, want %d", r, got, s.BytesSent)
		}
		step := num(value(t, fams, "tandem_ddp_step_seconds_total", nil))
		fb := num(value(t, fams, "tandem_ddp_forward_backward_seconds_total", nil))
		if step <= 0 || fb <= 0 || fb > step {
			t.Errorf("rank %d: step time %vs, forward and backward %vs: want both positive, the second within the first", r, step, fb)
		}
		fwd := num(value(t, fams, "tandem_ddp_forward_seconds_total", nil))
		bwd := num(value(t, fams, "tandem_ddp_backward_seconds_total", nil))
		if fwd != s.ForwardTime.Seconds() || bwd != s.BackwardTime.Seconds() || fwd <= 0 || bwd <= 0 || math.Abs(fwd+bwd-fb) > 1e-9 {
			t.Errorf("rank %d: forward %vs and backward %vs (Stats: %v, %v), want both positive, adding up to %vs", r, fwd, bwd, s.ForwardTime, s.BackwardTime, fb)
		}
		commT := num(value(t, fams, "tandem_ddp_communication_seconds_total", nil))
		over := num(value(t, fams, "tandem_ddp_overlapped_seconds_total", nil))
		if commT <= 0 || over > commT {
			t.Errorf("rank %d: communication %vs, overlapped %vs", r, commT, over)
		}
		if ratio := num(value(t, fams, "tandem_ddp_overlap_ratio", nil)); ratio < 0 || ratio > 1 {
			t.Errorf("rank %d: overlap ratio %v outside [0, 1]", r, ratio)
		}
		value(t, fams, "tandem_ddp_wait_seconds_total", nil)

		// RPC: rank 0 made the calls, rank 1 served them.
		if r == 0 {
			if got := num(value(t, fams, "tandem_rpc_calls_total", map[string]string{"state": "done"})); got != calls {
				t.Errorf("rank 0: %v RPC calls done, want %d", got, calls)
			}
			if s := value(t, fams, "tandem_rpc_call_duration_seconds", nil).GetSummary(); s.GetSampleCount() != calls || s.GetSampleSum() <= 0 || len(s.GetQuantile()) != 3 {
				t.Errorf("rank 0: RPC latency summary %v, want %d calls, a positive sum and 3 quantiles", s, calls)
			}
		} else if got := num(value(t, fams, "tandem_rpc_requests_total", map[string]string{"state": "served"})); got != calls {
			t.Errorf("rank 1: %v RPC requests served, want %d", got, calls)
		}

		if got := num(value(t, fams, "tandem_restarts", nil)); got != 2 {
			t.Errorf("rank %d: tandem_restarts = %v, want 2", r, got)
		}
		value(t, fams, "go_goroutines", nil)
	}

	// A second scrape counts only what happened since: one more coalesced
	// reduction on each rank.
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts := []*tensor.Dense{tensor.New(tensor.WithShape(2), tensor.Of(tensor.Float32))}
			errc <- pgs[r].AllReduceCoalesced(ctx, ts, comm.Sum).Wait(ctx)
		}()
	}
	wg.Wait()
	for range world {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, ctx, addrs[0])
	co := map[string]string{"kind": "all_reduce_coalesced"}
	if got := num(value(t, fams, "tandem_collective_bytes_total", co)); got != 2*56+8 {
		t.Errorf("after a third coalesced reduction: %v bytes, want 120", got)
	}
	if h := value(t, fams, "tandem_collective_duration_seconds", co).GetHistogram(); h.GetSampleCount() != 3 {
		t.Errorf("after a third coalesced reduction: %d latency samples, want 3", h.GetSampleCount())
	}

	// The server stops with its context.
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addrs[0] + metrics.Path)
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("the endpoint still answers 5s after its context was cancelled")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServeFromEnv(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t.Setenv(launch.MetricsAddrEnv, "")
	if addr, err := metrics.ServeFromEnv(ctx); addr != "" || err != nil {
		t.Fatalf("without %s: serving at %q, %v; want nothing served", launch.MetricsAddrEnv, addr, err)
	}
	t.Setenv(launch.MetricsAddrEnv, "127.0.0.1:0")
	t.Setenv(launch.RestartCountEnv, "3")
	addr, err := metrics.ServeFromEnv(ctx)
	if err != nil || addr == "" {
		t.Fatalf("ServeFromEnv: %q, %v", addr, err)
	}
	fams := scrape(t, ctx, addr)
	if got := num(value(t, fams, "tandem_restarts", nil)); got != 3 {
		t.Errorf("tandem_restarts = %v, want 3", got)
	}
}

func TestServeBadAddress(t *testing.T) {
	if _, err := metrics.Serve(context.Background(), "127.0.0.1:notaport"); err == nil {
		t.Fatal("Serve accepted a port that is not a number")
	}
}

// BenchmarkScrape measures a scrape that finds 1000 finished collectives
// new since the last one in the group's flight recorder (whose ring holds
// comm.DefaultFlightRecorderSize).
func BenchmarkScrape(b *testing.B) {
	ctx := context.Background()
	pgs, err := local.NewGroups(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	pg := pgs[0]
	defer pg.Close()
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", metrics.Group(pg))
	if err != nil {
		b.Fatal(err)
	}
	t := tensor.New(tensor.WithShape(1024), tensor.Of(tensor.Float32))
	const ops = 1000
	for b.Loop() {
		b.StopTimer()
		for range ops {
			if err := pg.AllReduce(ctx, t, comm.Sum).Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		resp, err := http.Get("http://" + addr + metrics.Path)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(ops, "collectives/scrape")
}

// A TCP store client's operations, observed by metrics.Store, are served
// by operation and outcome, with their latencies.
func TestStoreOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sm := metrics.Store()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken(""), store.WithObserver(sm))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 3 {
		if err := st.Set(ctx, fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Get(ctx, "k0"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Add(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}
	if err := st.Wait(ctx, []string{"never"}, 10*time.Millisecond); err == nil {
		t.Fatal("Wait for a key nobody sets succeeded")
	}
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", sm)
	if err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, ctx, addr)
	for _, c := range []struct {
		op, state string
		n         float64
	}{{"set", "done", 3}, {"get", "done", 1}, {"add", "done", 1}, {"wait", "failed", 1}} {
		if got := num(value(t, fams, "tandem_store_ops_total", map[string]string{"op": c.op, "state": c.state})); got != c.n {
			t.Errorf("tandem_store_ops_total{op=%s,state=%s} = %v, want %v", c.op, c.state, got, c.n)
		}
	}
	if h := value(t, fams, "tandem_store_op_duration_seconds", map[string]string{"op": "set"}).GetHistogram(); h.GetSampleCount() != 3 || h.GetSampleSum() <= 0 || h.GetSampleSum() > 30 {
		t.Errorf("set latency histogram: %d samples summing to %vs, want 3 and a positive sum", h.GetSampleCount(), h.GetSampleSum())
	}
	if h := value(t, fams, "tandem_store_op_duration_seconds", map[string]string{"op": "wait"}).GetHistogram(); h.GetSampleSum() < 0.005 {
		t.Errorf("the Wait that timed out after 10ms (by the server's clock) was observed taking %vs", h.GetSampleSum())
	}
}

// Sends and receives are counted by kind with their bytes, and one that
// waits (a receive whose message has not come) holds back nothing issued
// after it.
func TestGroupCountsSendRecv(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs, err := local.NewGroups(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	// Rank 1 waits for a message under tag 9 that does not come until the end.
	late := tensor.New(tensor.WithShape(1), tensor.Of(tensor.Float64))
	pending := pgs[1].IRecv(ctx, late, 0, 9)
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := tensor.New(tensor.WithShape(4), tensor.Of(tensor.Float32))
			for range 3 {
				var err error
				if r == 0 {
					err = pgs[0].Send(ctx, x, 1, 1)
				} else {
					err = pgs[1].Recv(ctx, x, 0, 1)
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- pgs[r].AllReduce(ctx, x, comm.Sum).Wait(ctx)
		}()
	}
	wg.Wait()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", metrics.Group(pgs[1]))
	if err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, ctx, addr)
	if got := num(value(t, fams, "tandem_collectives_total", map[string]string{"kind": "recv", "state": "done"})); got != 3 {
		t.Errorf("%v receives counted, want 3", got)
	}
	if got := num(value(t, fams, "tandem_collective_bytes_total", map[string]string{"kind": "recv"})); got != 3*16 {
		t.Errorf("%v bytes received, want 48", got)
	}
	if got := num(value(t, fams, "tandem_collectives_total", map[string]string{"kind": "all_reduce", "state": "done"})); got != 1 {
		t.Errorf("%v all_reduce counted after the waiting receive, want 1", got)
	}
	// The late message arrives: its receive is counted in the next scrape.
	if err := pgs[0].Send(ctx, late, 1, 9); err != nil {
		t.Fatal(err)
	}
	if err := pending.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, ctx, addr)
	if got := num(value(t, fams, "tandem_collectives_total", map[string]string{"kind": "recv", "state": "done"})); got != 4 {
		t.Errorf("%v receives counted once the late one came, want 4", got)
	}
}
