//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/store/torchstore"
	"github.com/tandemml/tandem/internal/testlog"
)

// storeProcess starts `tandem store` with args and environment entries env
// (TANDEM_TOKEN is cleared unless env sets it) and returns it with the
// address it printed, once it listens.
func storeProcess(t *testing.T, env []string, args ...string) (cmd *exec.Cmd, addr string, out, errOut *testlog.Buffer) {
	t.Helper()
	cmd, out, errOut = tandemProcess(t, append([]string{"store"}, args...)...)
	cmd.Env = append(append(cmd.Env, store.TokenEnv+"="), env...)
	mustNoErr(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	re := regexp.MustCompile(`listening on (\S+) \(`)
	for deadline := time.Now().Add(20 * time.Second); ; {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return cmd, m[1], out, errOut
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address line; stdout %q stderr %q", out, errOut)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStoreCommandServesUntilInterrupted(t *testing.T) {
	cmd, addr, out, errOut := storeProcess(t, nil, "-addr", "127.0.0.1:0", "-token", "s3cret")
	checkContains(t, out.String(), "(token required)")
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

func TestStoreCommandRefusesToStartWithoutToken(t *testing.T) {
	for _, args := range [][]string{{"-addr", "127.0.0.1:0"}, {"-addr", "127.0.0.1:0", "-token", ""}} {
		cmd, out, errOut := tandemProcess(t, append([]string{"store"}, args...)...)
		cmd.Env = append(cmd.Env, store.TokenEnv+"=")
		mustNoErr(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			mustTrue(t, err != nil, "tandem store %q without a token exited 0", args)
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Fatalf("tandem store %q without a token is still running; stdout %q", args, out)
		}
		checkEqual(t, "", out.String())
		for _, hint := range []string{"tandem store: no token", "-token", store.TokenEnv, "-insecure"} {
			checkContains(t, errOut.String(), hint)
		}
	}
}

func TestStoreCommandTokenFromEnvironment(t *testing.T) {
	_, addr, out, _ := storeProcess(t, []string{store.TokenEnv + "=from-env"}, "-addr", "127.0.0.1:0")
	checkContains(t, out.String(), "(token required)")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := store.Dial(ctx, addr, store.WithToken("from-env"))
	mustNoErr(t, err)
	mustNoErr(t, s.Close())
	_, err = store.Dial(ctx, addr, store.WithToken(""))
	mustTrue(t, errors.Is(err, store.ErrUnauthorized), "no token against $%s: %v", store.TokenEnv, err)
}

func TestStoreCommandInsecure(t *testing.T) {
	_, addr, out, _ := storeProcess(t, nil, "-addr", "127.0.0.1:0", "-insecure")
	checkContains(t, out.String(), "(no token required: -insecure)")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := store.Dial(ctx, addr, store.WithToken(""))
	mustNoErr(t, err)
	mustNoErr(t, s.Set(ctx, "k", []byte("v")))
	mustNoErr(t, s.Close())
}

// TestStoreCommandListensOnLoopbackByDefault starts `tandem store` without
// -addr: it listens on 127.0.0.1:29500, or, when something else holds that
// port, fails saying so; either way not on every interface.
func TestStoreCommandListensOnLoopbackByDefault(t *testing.T) {
	f, err := parseStoreFlags([]string{"-insecure"})
	mustNoErr(t, err)
	checkEqual(t, "127.0.0.1:29500", f.addr)

	cmd, out, errOut := tandemProcess(t, "store", "-token", "t")
	mustNoErr(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(out.String(), "listening on ") {
			checkContains(t, out.String(), "listening on 127.0.0.1:29500 (token required)")
			return
		}
		select {
		case <-exited:
			// The port was taken: the error names the address it tried.
			checkContains(t, errOut.String(), `listen on "127.0.0.1:29500"`)
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tandem store neither listened nor failed; stdout %q stderr %q", out, errOut)
		}
	}
}

func TestStoreCommandRejectsBadAddress(t *testing.T) {
	cmd, _, errOut := tandemProcess(t, "store", "-addr", "not-an-address", "-insecure")
	err := cmd.Run()
	mustTrue(t, err != nil, "tandem store with a bad address succeeded")
	checkContains(t, errOut.String(), "tandem store: store server: listen on")
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

func TestStoreCommandTorchProtocolNeedsInsecure(t *testing.T) {
	_, err := parseStoreFlags([]string{"-torch-protocol"})
	mustTrue(t, errors.Is(err, errTorchNeedsInsecure), "-torch-protocol alone: %v", err)
	_, err = parseStoreFlags([]string{"-torch-protocol", "-insecure", "-token", "t"})
	mustTrue(t, errors.Is(err, errTorchNeedsInsecure), "-torch-protocol -token: %v", err)
	f, err := parseStoreFlags([]string{"-torch-protocol", "-insecure"})
	mustNoErr(t, err)
	mustTrue(t, f.torch && f.insecure, "flags %+v", f)

	cmd, out, errOut := tandemProcess(t, "store", "-torch-protocol", "-addr", "127.0.0.1:0")
	cmd.Env = append(cmd.Env, store.TokenEnv+"=set")
	mustTrue(t, cmd.Run() != nil, "tandem store -torch-protocol without -insecure succeeded")
	checkEqual(t, "", out.String())
	for _, hint := range []string{"cannot authenticate", "-insecure", "drop -torch-protocol"} {
		checkContains(t, errOut.String(), hint)
	}
}

// TestStoreCommandTorchProtocol: `tandem store -torch-protocol -insecure`
// serves PyTorch's TCPStore protocol, says loudly that it is
// unauthenticated, and a Go torchstore client and (where torch is
// installed) a Python torch.distributed.TCPStore share its keys.
func TestStoreCommandTorchProtocol(t *testing.T) {
	cmd, addr, out, errOut := storeProcess(t, []string{store.TokenEnv + "=ignored"}, "-addr", "127.0.0.1:0", "-torch-protocol", "-insecure")
	checkContains(t, out.String(), "(PyTorch TCPStore protocol; UNAUTHENTICATED")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := torchstore.Dial(ctx, addr)
	mustNoErr(t, err)
	defer c.Close()
	mustNoErr(t, c.Set(ctx, "from-go", []byte("hello python")))
	n, err := c.Add(ctx, "counter", 2)
	mustNoErr(t, err)
	checkEqual(t, int64(2), n)

	if py, err := exec.Command("/usr/bin/python3", "-c", "import torch.distributed").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "" {
			t.Logf("not checking a Python client: /usr/bin/python3 cannot import torch.distributed (%v: %s)", err, strings.TrimSpace(string(py)))
		} else {
			t.Fatalf("/usr/bin/python3 cannot import torch.distributed under CI: %v: %s", err, py)
		}
	} else {
		host, port, _ := net.SplitHostPort(addr)
		script := `import sys, datetime, torch.distributed as d
s = d.TCPStore(sys.argv[1], int(sys.argv[2]), None, False, datetime.timedelta(seconds=30))
print(s.get("from-go").decode())
print(s.add("counter", 3))
s.set("from-python", "hello go")`
		got, err := exec.CommandContext(ctx, "/usr/bin/python3", "-c", script, host, port).CombinedOutput()
		mustNoErr(t, err, "python: %s", got)
		checkEqual(t, "hello python\n5\n", string(got))
		v, err := c.Get(ctx, "from-python")
		mustNoErr(t, err)
		checkEqual(t, "hello go", string(v))
	}

	mustNoErr(t, cmd.Process.Signal(os.Interrupt))
	mustNoErr(t, cmd.Wait(), "stderr: %s", errOut)
	checkContains(t, errOut.String(), "WITHOUT AUTHENTICATION")
	checkContains(t, errOut.String(), store.TokenEnv+" is set but ignored")
}
