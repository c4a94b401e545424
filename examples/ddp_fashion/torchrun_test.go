package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// crashOnce is the worker torchrun starts: the program itself, except that
// in torchrun's first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 is
// killed with SIGKILL as soon as rank 0 has saved the first epoch's
// checkpoint, which fails the attempt. Its arguments: the program's path,
// the checkpoint folder, then the program's arguments.
const crashOnce = `prog=$1; out=$2; shift 2
echo "attempt $TORCHELASTIC_RESTART_COUNT of at most $TORCHELASTIC_MAX_RESTARTS restarts: rank $RANK of $WORLD_SIZE"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then
	"$prog" "$@" & pid=$!
	i=0
	while [ ! -e "$out/checkpoint-epoch001.safetensors" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
	kill -9 $pid && echo "killed rank 1 after the first checkpoint"
	wait $pid
	exit 1
fi
exec "$prog" "$@"`

// TestTorchrunRestartResumes runs the example under torchrun with
// --max_restarts 1 and -resume: the first attempt loses rank 1 after an
// epoch, torchrun stops the other rank and starts both again with
// TORCHELASTIC_RESTART_COUNT=1 and a new rendezvous, and the job continues
// from the newest checkpoint to the last epoch instead of starting over.
func TestTorchrunRestartResumes(t *testing.T) {
	torchrun, err := exec.LookPath("torchrun")
	if err != nil {
		msg := "torchrun not found on PATH: install Debian's python3-torch (apt-get install python3-torch)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; CI installs it in .ci/run, so its install failed")
		}
		t.Skip(msg)
	}
	tmp := t.TempDir()
	prog := filepath.Join(tmp, "ddp_fashion")
	args := []string{"build", "-o", prog}
	if raceBuild {
		args = append(args, "-race")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", append(args, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dataDir, out := filepath.Join(tmp, "data"), filepath.Join(tmp, "out")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Enough examples that an epoch outlasts the wait for the first
	// checkpoint (half a second here, more under -race), few enough that
	// three take seconds.
	writeSynthetic(t, dataDir, 480, 40)

	cmd := exec.CommandContext(ctx, torchrun, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
		"--monitor_interval", "0.5", "-r", "1", "-t", "1", // -r 1 -t 1: torch 1.13 on Python 3.11, see examples/collectives
		"--no_python", "/bin/sh", "-c", crashOnce, "sh", prog, out,
		"-data", dataDir, "-out", out, "-resume", "-epochs", "3", "-batch", "16", "-seed", "3", "-progress", "off")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp, "GORACE=atexit_sleep_ms=100"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	t.Logf("torchrun ran %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("torchrun: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	// Rank 0's lines, in order, across both attempts.
	var rank0 []string
	for _, line := range strings.Split(stdout.String(), "\n") {
		if l, ok := strings.CutPrefix(line, "[default0]:"); ok {
			rank0 = append(rank0, l)
		}
	}
	got := strings.Join(rank0, "\n")
	first := strings.Index(got, "attempt 0 of at most 1 restarts: rank 0 of 2")
	second := strings.Index(got, "attempt 1 of at most 1 restarts: rank 0 of 2")
	if first < 0 || second < first {
		t.Fatalf("rank 0 did not run in attempt 0 and then attempt 1:\n%s\nstderr:\n%s", got, stderr.String())
	}
	t.Logf("rank 0:\n%s", got)
	before, after := got[first:second], got[second:]
	if !strings.Contains(before, "no intact checkpoint in "+out+": starting from epoch 1") {
		t.Errorf("attempt 0 did not start afresh:\n%s", before)
	}
	if !strings.Contains(stdout.String(), "[default1]:killed rank 1 after the first checkpoint") {
		t.Errorf("rank 1 was not killed in attempt 0:\n%s", stdout.String())
	}
	m := regexp.MustCompile(`resumed from \S+checkpoint-epoch(\d+)\.safetensors: (\d+) epoch\(s\) done`).FindStringSubmatch(after)
	if m == nil {
		t.Fatalf("attempt 1 did not resume from a checkpoint:\n%s", after)
	}
	done, _ := strconv.Atoi(m[2])
	if done < 1 || done > 3 {
		t.Fatalf("resumed with %d epochs done, want 1 to 3", done)
	}
	// Attempt 1 trains only what attempt 0 left, up to the third epoch.
	for e := 1; e <= 3; e++ {
		trained := strings.Contains(after, fmt.Sprintf("epoch %d/3: train loss", e))
		if trained != (e > done) {
			t.Errorf("attempt 1 trained epoch %d: %v; it resumed after epoch %d:\n%s", e, trained, done, after)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint-epoch003.safetensors")); err != nil {
		t.Errorf("no checkpoint of the last epoch: %v", err)
	}
}
