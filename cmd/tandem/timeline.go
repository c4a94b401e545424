package main

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/tandemml/tandem/ddp"
)

func init() {
	commands["timeline"] = command{summary: "merge the ranks' DDP timelines into one Chrome trace: tandem timeline -o OUT FILES...", run: runTimeline}
}

// runTimeline is `tandem timeline`: it merges the per-rank Chrome-trace
// files that ddp.Timeline wrote into one file naming each rank, for
// chrome://tracing or ui.perfetto.dev.
func runTimeline(_ context.Context, args []string) error {
	fs := commandFlags("timeline", "usage: tandem timeline [-o OUT] FILE...\n\nMerges the ranks' DDP timelines (ddp.Timeline's Chrome-trace JSON, one file per\nrank) into one trace with a process per rank, for chrome://tracing or ui.perfetto.dev.")
	out := fs.String("o", "", "write the merged trace here (default: standard output)")
	files, err := parseFileArgs(fs, args, "the ranks' timeline files")
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := ddp.MergeTimelines(&buf, files...); err != nil {
		return err
	}
	if *out == "" {
		_, err := os.Stdout.Write(buf.Bytes())
		return err
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("timeline: writing the merged trace: %w", err)
	}
	return nil
}
