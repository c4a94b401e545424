//go:build unix

package main

import (
	"encoding/json"
	"testing"
	"time"
)

// TestHelperElasticBenchMember is not a test: it is a member process of
// the job that TestBenchElastic starts by re-executing this test binary.
func TestHelperElasticBenchMember(t *testing.T) { runAsWorkerOf(t, benchElastic) }

// TestBenchElastic runs the benchmark end to end on a small model: three
// member processes, a fault-free run, then a kill -9 and a SIGSTOP. Every
// fault must be seen by the survivors and training must resume within 3 s,
// no committed step may be lost, and the throughput of both runs must be
// reported.
func TestBenchElastic(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes for about 15 s")
	}
	lines := runWorkerBench[json.RawMessage](t, benchElastic, "TestHelperElasticBenchMember", 90*time.Second,
		"-duration", "5s", "-fault-every", "2s", "-rejoin-after", "500ms", "-stop-for", "2s",
		"-settle", "1s", "-sizes", "32,16,4", "-batch", "12", "-json")
	if len(lines) != 3 {
		t.Fatalf("want a line per fault (2) and a summary, got %q", lines)
	}
	for i, l := range lines[:2] {
		var f elasticFaultResult
		if err := json.Unmarshal(l, &f); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		want := []string{"kill", "stop"}[i]
		if f.Bench != "elastic" || f.Fault != i+1 || f.Kind != want || f.Victim == "" || f.Skipped != "" {
			t.Errorf("fault %d: %+v, want a %s", i+1, f, want)
		}
		if f.DetectS <= 0 || f.DetectS >= 3 || f.ResumeS <= 0 || f.ResumeS >= 3 || f.ResumeS < f.DetectS {
			t.Errorf("fault %d (%s): detected after %vs, resumed after %vs; want both in (0, 3s)", i+1, f.Kind, f.DetectS, f.ResumeS)
		}
		if f.FirstStepS < f.ResumeS || f.Size < 2 {
			t.Errorf("fault %d (%s): first step after %vs in a round of %d; want after the resume, in a round of at least 2", i+1, f.Kind, f.FirstStepS, f.Size)
		}
		if f.ResumedFrom < f.CommittedBefore {
			t.Errorf("fault %d (%s): resumed from step %d, but step %d had been committed", i+1, f.Kind, f.ResumedFrom, f.CommittedBefore)
		}
		if f.IntervalS <= 0 {
			t.Errorf("fault %d: interval %v", i+1, f.IntervalS)
		}
		if f.Kind == "kill" && (!f.Rejoined || f.RejoinS <= 0 || f.Rejoiner == f.Victim) {
			t.Errorf("the killed member's replacement did not train: %+v", f)
		}
		t.Logf("%s of %s: detect %.3fs, resume %.3fs, steps lost %.1f, %s rejoined %v after %.3fs",
			f.Kind, f.Victim, f.DetectS, f.ResumeS, f.StepsLost, f.Rejoiner, f.Rejoined, f.RejoinS)
	}
	var s elasticSummary
	if err := json.Unmarshal(lines[2], &s); err != nil {
		t.Fatal(err)
	}
	if !s.Summary || s.Faults != 2 || s.FaultFree.StepsPerS <= 0 || s.Faulty.StepsPerS <= 0 || s.Ratio <= 0 ||
		s.MedianDetectS <= 0 || s.MedianResumeS <= 0 || s.FaultFree.LoadStart == "" {
		t.Errorf("summary: %+v", s)
	}
	if len(s.FaultFree.BySize) == 0 || s.FaultFree.BySize[0].Size != 3 || s.FaultFree.BySize[0].StepsPerS <= 0 || len(s.Faulty.BySize) == 0 {
		t.Errorf("the runs by round size: %+v, %+v", s.FaultFree.BySize, s.Faulty.BySize)
	}
	if len(s.FaultFree.Exits)+len(s.Faulty.Exits) > 0 {
		t.Errorf("members ended on their own: %v %v", s.FaultFree.Exits, s.Faulty.Exits)
	}
	t.Logf("%.1f steps/s with faults, %.1f without: %.0f%%", s.Faulty.StepsPerS, s.FaultFree.StepsPerS, 100*s.Ratio)
}
