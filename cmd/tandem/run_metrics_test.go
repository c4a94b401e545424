//go:build unix

package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/errs"
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
