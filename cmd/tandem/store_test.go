//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

func TestStoreCommandServesUntilInterrupted(t *testing.T) {
	cmd, out, errOut := tandemProcess(t, "store", "-addr", "127.0.0.1:0", "-token", "s3cret")
	mustNoErr(t, cmd.Start())
	defer cmd.Process.Kill()
	re := regexp.MustCompile(`listening on (\S+) \(token required\)`)
	var addr string
	for deadline := time.Now().Add(20 * time.Second); addr == ""; {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address line; stdout %q stderr %q", out, errOut)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := store.Dial(ctx, addr, store.WithToken("s3cret"))
	mustNoErr(t, err)
	mustNoErr(t, s.Set(ctx, "k", []byte("v")))
	v, err := s.Get(ctx, "k")
	mustNoErr(t, err)
	checkEqual(t, "v", string(v))
	_, err = store.Dial(ctx, addr, store.WithToken("wrong"))
	mustTrue(t, errors.Is(err, store.ErrUnauthorized), "wrong token: %v", err)
	mustNoErr(t, s.Close())

	mustNoErr(t, cmd.Process.Signal(os.Interrupt))
	mustNoErr(t, cmd.Wait(), "stderr: %s", errOut)
	checkContains(t, errOut.String(), "refusing connection")
	checkContains(t, errOut.String(), "wrong token")
}

func TestStoreCommandRejectsBadAddress(t *testing.T) {
	cmd, _, errOut := tandemProcess(t, "store", "-addr", "not-an-address")
	err := cmd.Run()
	mustTrue(t, err != nil, "tandem store with a bad address succeeded")
	checkContains(t, errOut.String(), "tandem store: ")
}

func TestBenchStoreJSON(t *testing.T) {
	cmd, out, errOut := tandemProcess(t, "bench", "store", "-clients", "1,3", "-ops", "300", "-json")
	mustNoErr(t, cmd.Run(), "stderr: %s", errOut)
	var clients []int
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var r storeBenchResult
		mustNoErr(t, json.Unmarshal(sc.Bytes(), &r), "line %q", sc.Text())
		checkEqual(t, "store", r.Bench)
		checkEqual(t, 300, r.Ops)
		mustTrue(t, r.OpsPerSec > 0 && r.P99us >= r.P50us, "implausible result %+v", r)
		clients = append(clients, r.Clients)
	}
	checkEqual(t, []int{1, 3}, clients)
}

func TestBenchStoreRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-clients", "0"}, {"-clients", "x"}, {"-ops", "0"}} {
		err := benchStore(context.Background(), args)
		mustTrue(t, err != nil, "bench store %q succeeded", args)
	}
}
