//go:build unix

package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/metrics"
)

func TestRunMetricsAddrPerWorker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	mustNoErr(t, err)
	base := l.Addr().(*net.TCPAddr).Port
	mustNoErr(t, l.Close())
	out, _, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "-metrics-addr", "127.0.0.1:"+strconv.Itoa(base),
		"--", "sh", "-c", `echo $LOCAL_RANK $TANDEM_METRICS_ADDR`)
	mustNoErr(t, err)
	lines := sortedLines(out)
	mustEqual(t, 2, len(lines))
	for i, line := range lines {
		checkEqual(t, []string{"[" + strconv.Itoa(i) + "]", strconv.Itoa(i), "127.0.0.1:" + strconv.Itoa(base+i)}, strings.Fields(line))
	}

	// Without the flag, no worker is told to serve.
	out, _, err = launchArgs(t, context.Background(), nil, "-nproc", "1", "--", "sh", "-c", `echo "[$TANDEM_METRICS_ADDR]"`)
	mustNoErr(t, err)
	checkEqual(t, []string{"[0] []"}, sortedLines(out))
}

func TestRunRejectsBadMetricsAddr(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"nohost", "give HOST:PORT"},
		{"h:port", "is not a number"},
		{"h:65535", "past 65535"}, // two workers: the second would need 65536
	} {
		_, err := parseRunFlags([]string{"-nproc", "2", "-metrics-addr", tc.addr, "true"}, noEnv, io.Discard)
		mustErr(t, err)
		checkErrorIs(t, err, errs.InvalidArgument)
		checkContains(t, err.Error(), tc.want)
		checkEqual(t, 2, exitCodeOf(t, err))
	}
}

// metricsWorkerEnv makes this test binary a worker that serves its metrics
// (metrics.ServeFromEnv), writes the address it bound to the directory the
// variable names, and exits once a file "stop" appears there.
const metricsWorkerEnv = "TANDEM_RUN_METRICS_WORKER"

// TestHelperMetricsWorker is not a test: it is the worker of
// TestRunWorkersServeMetrics.
func TestHelperMetricsWorker(t *testing.T) {
	dir := os.Getenv(metricsWorkerEnv)
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := metrics.ServeFromEnv(ctx)
	if err != nil || addr == "" {
		t.Fatalf("ServeFromEnv: %q, %v", addr, err)
	}
	rank := os.Getenv("RANK")
	if err := os.WriteFile(filepath.Join(dir, "tmp"+rank), []byte(addr), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "tmp"+rank), filepath.Join(dir, "addr"+rank)); err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("never told to stop")
}

// Workers of `tandem run -metrics-addr` serve endpoints that the client
// library's parser reads, with the launcher's restart count.
func TestRunWorkersServeMetrics(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(metricsWorkerEnv, dir)
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	done := make(chan error, 1)
	go func() {
		// Port 0: every worker picks a free port of its own.
		_, _, err := launchArgs(t, context.Background(), nil, "-nproc", "2", "-metrics-addr", "127.0.0.1:0",
			"--", os.Args[0], "-test.run=^TestHelperMetricsWorker$")
		done <- err
	}()
	defer func() {
		os.WriteFile(filepath.Join(dir, "stop"), nil, 0o600)
		if err := <-done; err != nil {
			t.Errorf("tandem run: %v", err)
		}
	}()
	waitForFiles(t, dir, "addr0", "addr1")
	for r := range 2 {
		addr, err := os.ReadFile(filepath.Join(dir, "addr"+strconv.Itoa(r)))
		mustNoErr(t, err)
		resp, err := http.Get("http://" + string(addr) + metrics.Path)
		mustNoErr(t, err)
		var p expfmt.TextParser
		fams, err := p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		mustNoErr(t, err, "parsing rank %d's metrics", r)
		f := fams["tandem_restarts"]
		checkTrue(t, f != nil && len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge().GetValue() == 0, "rank %d: tandem_restarts %v, want 0", r, f)
		checkTrue(t, fams["process_start_time_seconds"] != nil, "rank %d: no process metrics", r)
	}
}
