package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandemml/tandem/ddp"
)

// Two goroutine ranks train one epoch with -timeline: rank 0 writes one
// Chrome-trace file holding both ranks' forward, backward, all-reduce, wait
// and optimizer events (the window slid back to the run's last steps, as the
// run is shorter than -timeline-from), and its picture.
func TestTimelineFile(t *testing.T) {
	trainSet, testSet := loadSynthetic(t)
	out := t.TempDir()
	cfg := testConfig(out, 1)
	cfg.Timeline = filepath.Join(out, "tl", "timeline.json")
	cfg.TimelineFrom, cfg.TimelineSteps = 1000, 5
	res := runRanks(t, 2, cfg, trainSet, testSet)
	if !strings.Contains(res[0].out, "saved the timeline") {
		t.Fatalf("rank 0 did not report the timeline:\n%s", res[0].out)
	}
	b, err := os.ReadFile(cfg.Timeline)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Dur  float64        `json:"dur"`
			Pid  int            `json:"pid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatalf("the timeline is not JSON: %v", err)
	}
	seen := map[int]map[string]int{}
	steps := map[float64]bool{}
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		if e.Dur < 0 {
			t.Fatalf("negative duration: %+v", e)
		}
		if seen[e.Pid] == nil {
			seen[e.Pid] = map[string]int{}
		}
		seen[e.Pid][e.Name]++
		steps[e.Args["step"].(float64)] = true
	}
	if len(steps) != cfg.TimelineSteps {
		t.Fatalf("steps recorded %v, want %d", steps, cfg.TimelineSteps)
	}
	for r := range 2 {
		for _, name := range []string{ddp.EventForward, ddp.EventBackward, ddp.EventAllReduce, ddp.EventWait, ddp.EventOptimizer} {
			if seen[r][name] < cfg.TimelineSteps {
				t.Fatalf("rank %d: %d %q events, want at least %d (all: %v)", r, seen[r][name], name, cfg.TimelineSteps, seen)
			}
		}
	}
	f, err := os.Open(filepath.Join(out, "tl", "timeline.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if w := img.Bounds().Dx(); w != tlWidth {
		t.Fatalf("picture %d pixels wide, want %d", w, tlWidth)
	}
}
