package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandemml/tandem/ddp"
)

// `tandem timeline -o` merges two ranks' files into one trace naming both.
func TestTimelineMergesRanks(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for r := range 2 {
		f := filepath.Join(dir, "rank"+string(rune('0'+r))+".json")
		fh, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		tr := ddp.Trace{TraceEvents: []ddp.TraceEvent{{Name: ddp.EventForward, Ph: "X", Ts: int64(100 + r), Dur: 5, Pid: r, Tid: ddp.LaneCompute}}}
		if err := ddp.WriteTrace(fh, tr); err != nil {
			t.Fatal(err)
		}
		fh.Close()
		files = append(files, f)
	}
	out := filepath.Join(dir, "merged.json")
	if err := runTimeline(context.Background(), append([]string{"-o", out}, files...)); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	tr, err := ddp.ReadTrace(fh)
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	forwards := 0
	for _, e := range tr.TraceEvents {
		if e.Name == "process_name" {
			names[e.Pid] = e.Label
		}
		if e.Name == ddp.EventForward {
			forwards++
		}
	}
	if names[0] != "rank 0" || names[1] != "rank 1" || forwards != 2 {
		t.Fatalf("merged trace: names %v, %d forward events:\n%+v", names, forwards, tr.TraceEvents)
	}
	if err := runTimeline(context.Background(), nil); err == nil {
		t.Fatal("no files: want an error")
	}
}
