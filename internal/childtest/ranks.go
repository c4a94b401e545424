package childtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Ranks runs the test binary again as a world of n processes, with only the
// test named helper, and waits up to within for every one of them to exit.
// Rank r's environment adds what a launcher sets (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
// MASTER_PORT) and then env ("NAME=value" each). It returns what each rank
// printed on stdout, followed by "(exit: <error>)" for a rank that failed;
// the ranks' stderr is the test's. A rank still running when the test ends
// is killed.
func Ranks(t testing.TB, n int, within time.Duration, helper string, env ...string) []string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	outs := make([]string, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Env = append(cmd.Env, env...)
		cmd.Stderr = os.Stderr
		var out strings.Builder
		cmd.Stdout = &out
		require.NoErrorf(t, cmd.Start(), "rank %d", r)
		t.Cleanup(func() { cmd.Process.Kill(); wg.Wait() })
		wg.Go(func() {
			err := cmd.Wait()
			outs[r] = out.String()
			if err != nil {
				outs[r] += fmt.Sprintf("\n(exit: %v)", err)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		require.FailNowf(t, "processes hung", "the %d processes did not finish within %v", n, within)
	}
	return outs
}
