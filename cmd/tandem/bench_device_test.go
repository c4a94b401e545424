//go:build !tandemcuda

package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestBenchDeviceFlag: without the tandemcuda tag, -device cuda fails at
// once and says how to get a CUDA build; an unknown device is refused.
func TestBenchDeviceFlag(t *testing.T) {
	ctx := context.Background()
	for name, run := range map[string]func([]string) error{
		"train": func(a []string) error { return benchTrain(ctx, a) },
		"ddp":   func(a []string) error { return benchDDP(ctx, a, io.Discard, nil) },
	} {
		err := run([]string{"-device", "cuda"})
		if err == nil || !strings.Contains(err.Error(), "built without -tags tandemcuda") || !strings.Contains(err.Error(), "make check-cuda") {
			t.Errorf("bench %s -device cuda: got %v, want the without-tandemcuda message", name, err)
		}
		if err := run([]string{"-device", "tpu"}); err == nil || !strings.Contains(err.Error(), `-device "tpu"`) {
			t.Errorf("bench %s -device tpu: got %v", name, err)
		}
	}
}
