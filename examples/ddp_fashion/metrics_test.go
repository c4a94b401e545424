package main

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/tandemml/tandem/launch"
	"github.com/tandemml/tandem/metrics"
)

// scrapeOnWrite scrapes the endpoint the command announced when it writes
// its test accuracy: after training, while the endpoint still serves.
type scrapeOnWrite struct {
	t    *testing.T
	mu   sync.Mutex
	text strings.Builder
	fams map[string]*dto.MetricFamily
	err  error
}

var servesAt = regexp.MustCompile(`serves metrics at (http://\S+)`)

func (s *scrapeOnWrite) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.text.Write(p)
	if s.fams != nil || s.err != nil || !strings.Contains(string(p), "test accuracy") {
		return len(p), nil
	}
	m := servesAt.FindStringSubmatch(s.text.String())
	if m == nil {
		return len(p), nil
	}
	if !strings.HasSuffix(m[1], metrics.Path) {
		s.t.Errorf("the endpoint %s is not at %s", m[1], metrics.Path)
	}
	resp, err := http.Get(m[1])
	if err != nil {
		s.err = err
		return len(p), nil
	}
	defer resp.Body.Close()
	var tp expfmt.TextParser
	s.fams, s.err = tp.TextToMetricFamilies(resp.Body)
	return len(p), nil
}

func TestServesMetricsWhenAsked(t *testing.T) {
	for _, v := range []string{"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: this test runs the command as a lone process", v)
		}
	}
	t.Setenv(launch.MetricsAddrEnv, "127.0.0.1:0")
	dir, out := t.TempDir(), t.TempDir()
	writeSynthetic(t, dir, 64, 20)
	w := &scrapeOnWrite{t: t}
	args := []string{"-data", dir, "-epochs", "1", "-batch", "16", "-limit", "48", "-out", out, "-progress", "off"}
	if err := run(context.Background(), args, w); err != nil {
		t.Fatalf("%v\n%s", err, w.text.String())
	}
	if w.err != nil || w.fams == nil {
		t.Fatalf("scraping the endpoint after training: %v\n%s", w.err, w.text.String())
	}
	f := w.fams["tandem_collective_ops_recorded_total"]
	if f == nil || len(f.GetMetric()) == 0 || f.GetMetric()[0].GetCounter().GetValue() <= 0 {
		t.Errorf("no collectives recorded in the scrape: %v", f)
	}
	if f := w.fams["tandem_collectives_total"]; f == nil || len(f.GetMetric()) == 0 {
		t.Errorf("no finished collectives in the scrape: %v", f)
	}
	if f := w.fams["tandem_restarts"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() != 0 {
		t.Errorf("tandem_restarts: %v, want 0", f)
	}
}
