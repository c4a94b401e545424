package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/tandemml/tandem/metrics"
)

// scrapeDemo fetches url and parses the body with the client library's own
// text parser.
func scrapeDemo(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	var p expfmt.TextParser
	return p.TextToMetricFamilies(resp.Body)
}

// metricValue is the value of name's series whose labels include want, and
// whether there is one.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (*dto.Metric, bool) {
next:
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m, true
	}
	return nil, false
}

// demoRank is what a scrape of one rank says, as numbers.
type demoRank struct {
	steps, step, fwd, bwd, fb, comm, overlap float64
	allReduce                                float64
	allReduceTimed                           uint64
	storeOps                                 float64
	storeTimed                               uint64
	restarts                                 float64
}

// readDemo reads the figures the test checks, failing on a missing one.
func readDemo(t *testing.T, rank int, fams map[string]*dto.MetricFamily) demoRank {
	t.Helper()
	get := func(name string, labels map[string]string) *dto.Metric {
		m, ok := metricValue(fams, name, labels)
		if !ok {
			t.Fatalf("rank %d: no %s%v in the scrape", rank, name, labels)
		}
		return m
	}
	n := func(name string, labels map[string]string) float64 {
		m := get(name, labels)
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
		t.Fatalf("rank %d: %s is neither a counter nor a gauge", rank, name)
		return 0
	}
	var d demoRank
	d.steps = n("tandem_ddp_steps_total", map[string]string{"kind": "sync"})
	d.step = n("tandem_ddp_step_seconds_total", nil)
	d.fwd = n("tandem_ddp_forward_seconds_total", nil)
	d.bwd = n("tandem_ddp_backward_seconds_total", nil)
	d.fb = n("tandem_ddp_forward_backward_seconds_total", nil)
	d.comm = n("tandem_ddp_communication_seconds_total", nil)
	d.overlap = n("tandem_ddp_overlap_ratio", nil)
	d.allReduce = n("tandem_collectives_total", map[string]string{"kind": "all_reduce", "state": "done"})
	d.allReduceTimed = get("tandem_collective_duration_seconds", map[string]string{"kind": "all_reduce"}).GetHistogram().GetSampleCount()
	for _, m := range fams["tandem_store_ops_total"].GetMetric() {
		d.storeOps += m.GetCounter().GetValue()
	}
	for _, m := range fams["tandem_store_op_duration_seconds"].GetMetric() {
		d.storeTimed += m.GetHistogram().GetSampleCount()
	}
	n("tandem_store_ops_total", map[string]string{"op": "compare_set", "state": "done"}) // the rank's claim
	d.restarts = n("tandem_restarts", nil)
	return d
}

var (
	servesLine  = regexp.MustCompile(`^\[(\d)\] ddp_fashion: rank (\d) serves metrics at (http://\S+)$`)
	epochLine   = regexp.MustCompile(`^\[0\] epoch (\d)/\d: .*test accuracy`)
	trainLine   = regexp.MustCompile(`\((\d+) per rank, (\d+) steps of`)
	demoTimeout = 4 * time.Minute
)

// TestDemoServesMetrics runs the training as `make demo` does: the
// launcher starts two ranks with -metrics-addr 127.0.0.1:0, each picks a
// port and says where it serves. After the first and the second epoch,
// while the ranks train on, the test scrapes both endpoints and reads the
// bodies with the client library's parser: the collectives, DDP's step,
// forward, backward and communication times, the store's operations and
// the restarts are there, with sane values, and grow from one scrape to
// the next.
func TestDemoServesMetrics(t *testing.T) {
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), demoTimeout)
	defer cancel()
	bin := map[string]string{"tandem": "../../cmd/tandem", "ddp_fashion": "."}
	for name, pkg := range bin {
		out := filepath.Join(tmp, name)
		args := []string{"build", "-o", out}
		if raceBuild {
			args = append(args, "-race")
		}
		if b, err := exec.CommandContext(ctx, "go", append(args, pkg)...).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
		bin[name] = out
	}
	dataDir, out := filepath.Join(tmp, "data"), filepath.Join(tmp, "out")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Enough steps per epoch that the next epoch outlasts a scrape.
	writeSynthetic(t, dataDir, 128, 16)

	cmd := exec.CommandContext(ctx, bin["tandem"], "run", "-nproc", "2", "-metrics-addr", "127.0.0.1:0", "--",
		bin["ddp_fashion"], "-data", dataDir, "-epochs", "3", "-batch", "8", "-out", out, "-progress", "off")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp, "GORACE=atexit_sleep_ms=100"}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := map[int]string{}
	var seen []string
	var stepsPerEpoch float64
	var scrapes [][2]demoRank
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if m := servesLine.FindStringSubmatch(line); m != nil {
			if m[1] != m[2] {
				t.Errorf("line %q: rank %s prints for rank %s", line, m[1], m[2])
			}
			if !strings.HasSuffix(m[3], metrics.Path) {
				t.Errorf("line %q: the endpoint is not at %s", line, metrics.Path)
			}
			urls[int(m[2][0]-'0')] = m[3]
		}
		if m := trainLine.FindStringSubmatch(line); m != nil {
			fmt.Sscan(m[2], &stepsPerEpoch)
		}
		m := epochLine.FindStringSubmatch(line)
		if m == nil || len(scrapes) == 2 {
			continue
		}
		if len(urls) != 2 {
			t.Fatalf("epoch %s ended and not both ranks said where they serve metrics:\n%s", m[1], strings.Join(seen, "\n"))
		}
		var pair [2]demoRank
		for r := range 2 {
			fams, err := scrapeDemo(ctx, urls[r])
			if err != nil {
				t.Fatalf("scraping rank %d after epoch %s: %v", r, m[1], err)
			}
			pair[r] = readDemo(t, r, fams)
		}
		scrapes = append(scrapes, pair)
	}
	// Read to the end before Wait, so that the output is whole.
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tandem run: %v\nstdout:\n%s\nstderr:\n%s", err, strings.Join(seen, "\n"), stderr.String())
	}
	if len(scrapes) != 2 || stepsPerEpoch == 0 {
		t.Fatalf("scraped %d times (want after epochs 1 and 2), %v steps per epoch; output:\n%s", len(scrapes), stepsPerEpoch, strings.Join(seen, "\n"))
	}
	for i, pair := range scrapes {
		epochs := float64(i + 1)
		for r, d := range pair {
			t.Logf("after epoch %d, rank %d: %+v", i+1, r, d)
			if d.steps < epochs*stepsPerEpoch || d.steps > 3*stepsPerEpoch {
				t.Errorf("after epoch %d, rank %d: %v DDP steps, want from %v to %v", i+1, r, d.steps, epochs*stepsPerEpoch, 3*stepsPerEpoch)
			}
			if d.fwd <= 0 || d.bwd <= 0 || math.Abs(d.fwd+d.bwd-d.fb) > 1e-6 || d.fb > d.step || d.step <= 0 {
				t.Errorf("after epoch %d, rank %d: forward %vs + backward %vs against %vs, step %vs: want positive parts adding up, within the steps", i+1, r, d.fwd, d.bwd, d.fb, d.step)
			}
			if d.comm <= 0 || d.comm > d.step || d.overlap < 0 || d.overlap > 1 {
				t.Errorf("after epoch %d, rank %d: communication %vs of %vs, overlap %v", i+1, r, d.comm, d.step, d.overlap)
			}
			if d.allReduce < d.steps || uint64(d.allReduce) != d.allReduceTimed {
				t.Errorf("after epoch %d, rank %d: %v all_reduce done (%d timed) for %v steps: want at least one a step, each timed", i+1, r, d.allReduce, d.allReduceTimed, d.steps)
			}
			if d.storeOps < 3 || uint64(d.storeOps) != d.storeTimed {
				t.Errorf("after epoch %d, rank %d: %v store operations, %d timed: want the rendezvous' operations, each timed", i+1, r, d.storeOps, d.storeTimed)
			}
			if d.restarts != 0 {
				t.Errorf("after epoch %d, rank %d: %v restarts, want 0", i+1, r, d.restarts)
			}
		}
	}
	for r := range 2 {
		a, b := scrapes[0][r], scrapes[1][r]
		if b.steps < a.steps+stepsPerEpoch || b.step <= a.step || b.fwd <= a.fwd || b.bwd <= a.bwd || b.comm <= a.comm || b.allReduce <= a.allReduce {
			t.Errorf("rank %d: the second scrape did not grow by an epoch: %+v, then %+v", r, a, b)
		}
	}
}
