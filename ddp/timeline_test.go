package ddp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/optim"
)

// chromeTrace is the Chrome-trace format as a viewer reads it, decoded
// independently of ddp's own types.
type chromeTrace struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   *float64       `json:"ts"`
		Dur  float64        `json:"dur"`
		Pid  *int           `json:"pid"`
		Tid  *int           `json:"tid"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
}

// Three goroutine ranks train eight steps with a timeline keeping steps 2
// to 5 and small buckets; each writes its file, and the merged file is
// Chrome-trace JSON with, for every rank, a name, the forward and backward
// passes, every bucket's all-reduce, the wait and the optimizer step of each
// kept step, all with non-negative durations, the reductions inside their
// step. Gathering over the group gives the same events as merging the files.
func TestTimelineMergedAcrossRanks(t *testing.T) {
	const world, steps, from, keep = 3, 8, 2, 4
	pgs := localWorld(t, world)
	ctx := testCtx(t, time.Minute)
	dir := t.TempDir()
	files := make([]string, world)
	nbuckets := make([]int, world)
	gathered := make([]ddp.Trace, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		tl := ddp.NewTimeline(from, keep)
		model := newMLP(t, []int{8, 32, 32, 4}, 1)
		net, err := ddp.New(ctx, pgs[r], model, ddp.BucketCapMB(0.001), ddp.FirstBucketCapMB(0.001), ddp.WithTimeline(tl))
		if err != nil {
			return err
		}
		opt, err := optim.NewSGD(model.Params(), optim.LR(0.01))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 8, 8, 4)
		for range steps {
			if _, err := net.Step(ctx, x, y); err != nil {
				return err
			}
			t0 := time.Now()
			if err := opt.Step(); err != nil {
				return err
			}
			net.Timeline().Span(ddp.EventOptimizer, t0, time.Now())
		}
		nbuckets[r] = len(net.Stats().Buckets)
		files[r] = filepath.Join(dir, "rank"+string(rune('0'+r))+".json")
		f, err := os.Create(files[r])
		if err != nil {
			return err
		}
		if _, err := tl.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		gathered[r], err = tl.Gather(ctx, pgs[r], 0)
		return err
	})
	if nbuckets[0] < 2 {
		t.Fatalf("want several buckets, got %d", nbuckets[0])
	}
	var merged bytes.Buffer
	if err := ddp.MergeTimelines(&merged, files...); err != nil {
		t.Fatal(err)
	}
	var tr chromeTrace
	if err := json.Unmarshal(merged.Bytes(), &tr); err != nil {
		t.Fatalf("merged timeline is not JSON: %v\n%s", err, merged.String())
	}
	type key struct {
		rank int
		name string
	}
	count := map[key]int{}
	named := map[int]string{}
	stepSpan := map[[2]int][2]float64{} // rank, step -> start, end
	for _, e := range tr.TraceEvents {
		if e.Pid == nil || e.Ts == nil || e.Tid == nil {
			t.Fatalf("event without pid, tid or ts: %+v", e)
		}
		switch e.Ph {
		case "M":
			if e.Name == "process_name" {
				named[*e.Pid], _ = e.Args["name"].(string)
			}
			continue
		case "X":
		default:
			t.Fatalf("unexpected phase %q", e.Ph)
		}
		if e.Dur < 0 {
			t.Fatalf("negative duration: %+v", e)
		}
		count[key{*e.Pid, e.Name}]++
		st, ok := e.Args["step"].(float64)
		if !ok || st < from || st >= from+keep {
			t.Fatalf("event outside the window of steps %d..%d: %+v", from, from+keep-1, e)
		}
		if e.Name == ddp.EventStep {
			stepSpan[[2]int{*e.Pid, int(st)}] = [2]float64{*e.Ts, *e.Ts + e.Dur}
		}
		if e.Name == ddp.EventAllReduce && (e.Args["bytes"].(float64) <= 0 || *e.Tid != ddp.LaneBucket0+int(e.Args["bucket"].(float64))) {
			t.Fatalf("all-reduce event without its bucket's lane and bytes: %+v", e)
		}
	}
	for _, e := range tr.TraceEvents {
		if e.Name != ddp.EventAllReduce {
			continue
		}
		sp := stepSpan[[2]int{*e.Pid, int(e.Args["step"].(float64))}]
		if *e.Ts < sp[0] || *e.Ts+e.Dur > sp[1] {
			t.Fatalf("all-reduce %+v outside its step [%v, %v]", e, sp[0], sp[1])
		}
	}
	for r := range world {
		if named[r] != "rank "+string(rune('0'+r)) {
			t.Fatalf("rank %d is named %q", r, named[r])
		}
		for _, name := range []string{ddp.EventStep, ddp.EventForward, ddp.EventBackward, ddp.EventWait, ddp.EventOptimizer} {
			if n := count[key{r, name}]; n != keep {
				t.Fatalf("rank %d: %d %q events, want %d", r, n, name, keep)
			}
		}
		if n := count[key{r, ddp.EventAllReduce}]; n != keep*nbuckets[r] {
			t.Fatalf("rank %d: %d all-reduce events, want %d", r, n, keep*nbuckets[r])
		}
	}
	// Gathering over the group: the same events on rank 0, none elsewhere.
	var g, m int
	for _, e := range gathered[0].TraceEvents {
		if e.Ph == "X" {
			g++
		}
	}
	for _, n := range count {
		m += n
	}
	if g != m || len(gathered[1].TraceEvents) != 0 {
		t.Fatalf("gathered %d events on rank 0 (%d on rank 1), merged files hold %d", g, len(gathered[1].TraceEvents), m)
	}
	var buf bytes.Buffer
	if err := ddp.WriteTrace(&buf, gathered[0]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"args":{"name":"rank 2"}`) {
		t.Fatalf("gathered trace does not name rank 2:\n%s", buf.String())
	}
}

// A nil Timeline records nothing and does not fail.
func TestTimelineNil(t *testing.T) {
	var tl *ddp.Timeline
	tl.Span(ddp.EventOptimizer, time.Now(), time.Now())
	if tl.Events() != nil || len(tl.Trace().TraceEvents) != 0 {
		t.Fatal("a nil Timeline holds events")
	}
	var buf bytes.Buffer
	if _, err := tl.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := ddp.ReadTrace(&buf); err != nil {
		t.Fatalf("empty trace does not read back: %v", err)
	}
}

// BenchmarkTimeline measures a step of two goroutine ranks without a
// timeline and with one recording every step.
func BenchmarkTimeline(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			pgs, err := local.NewGroups(context.Background(), 2, comm.WithTimeout(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			defer closeAll(pgs)
			ctx := context.Background()
			nets := make([]*ddp.DDP, 2)
			errs := testkit.EachRank(2, func(r int) error {
				var opts []ddp.Option
				if on {
					opts = append(opts, ddp.WithTimeline(ddp.NewTimeline(0, 0)))
				}
				nets[r], err = ddp.New(ctx, pgs[r], newMLP(b, []int{64, 256, 256, 10}, 1), append(opts, ddp.BucketCapMB(0.1))...)
				return err
			})
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			x, y := batch(1, 32, 64, 10)
			b.ResetTimer()
			errs = testkit.EachRank(2, func(r int) error {
				for range b.N {
					if _, err := nets[r].Step(ctx, x, y); err != nil {
						return err
					}
				}
				return nil
			})
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// GraphDDP records its steps too: under the graph executor the forward
// and backward passes (split at the loss), under TapeMachine a run of the
// whole graph as one forward+backward event, followed by the all-reduce
// and the wait.
func TestTimelineGraphDDP(t *testing.T) {
	for _, tape := range []bool{false, true} {
		t.Run(fmt.Sprintf("tape=%v", tape), func(t *testing.T) { testTimelineGraphDDP(t, tape) })
	}
}

func testTimelineGraphDDP(t *testing.T, tape bool) {
	const world, steps = 2, 3
	pgs := localWorld(t, world)
	ctx := testCtx(t, time.Minute)
	tls := make([]*ddp.Timeline, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		g := G.NewGraph()
		x := G.NewMatrix(g, G.Float64, G.WithShape(2, 1), G.WithName("x"))
		y := G.NewMatrix(g, G.Float64, G.WithShape(2, 1), G.WithName("y"))
		w := G.NewMatrix(g, G.Float64, G.WithShape(1, 1), G.WithName("w"),
			G.WithValue(tensor.New(tensor.WithShape(1, 1), tensor.WithBacking([]float64{1}))))
		loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(G.Must(G.Mul(x, w)), y))))))
		grads, err := G.Grad(loss, w)
		if err != nil {
			return err
		}
		tls[r] = ddp.NewTimeline(0, 0)
		opts := []ddp.Option{ddp.WithTimeline(tls[r])}
		if tape {
			opts = append(opts, ddp.WithTapeMachine())
		}
		net, err := ddp.NewGraph(ctx, pgs[r], ddp.GraphSpec{Graph: g, Loss: loss, Params: G.Nodes{w}, Grads: grads}, opts...)
		if err != nil {
			return err
		}
		xb := tensor.New(tensor.WithShape(2, 1), tensor.WithBacking([]float64{1, 2}))
		yb := tensor.New(tensor.WithShape(2, 1), tensor.WithBacking([]float64{2, 4}))
		for range steps {
			if _, err := net.Step(ctx, ddp.ByName{"x": xb, "y": yb}); err != nil {
				return err
			}
		}
		return nil
	})
	for r, tl := range tls {
		n := map[string]int{}
		for _, e := range tl.Events() {
			if e.Pid != r || e.Dur < 0 {
				t.Fatalf("rank %d: event %+v", r, e)
			}
			n[e.Name]++
		}
		compute := n[ddp.EventForward] == steps && n[ddp.EventBackward] == steps && n[ddp.EventForward+"+"+ddp.EventBackward] == 0
		if tape {
			compute = n[ddp.EventForward+"+"+ddp.EventBackward] == steps && n[ddp.EventForward] == 0
		}
		if !compute || n[ddp.EventAllReduce] != steps || n[ddp.EventWait] != steps || n[ddp.EventStep] != steps {
			t.Fatalf("rank %d: events %v, want %d of each", r, n, steps)
		}
	}
}
