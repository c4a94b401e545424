package comm

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// hostIDHelperEnv makes a re-executed test binary print its host identity.
const hostIDHelperEnv = "TANDEM_COMM_HOSTID_HELPER"

// TestHelperHostID is not a test: it is the child of TestHostIDNamespaces,
// printing the identity the automatic backend would publish.
func TestHelperHostID(t *testing.T) {
	if os.Getenv(hostIDHelperEnv) == "" {
		t.Skip("helper process for TestHostIDNamespaces")
	}
	os.Stdout.WriteString("HOSTID " + localHostID() + "\n")
	os.Exit(0)
}

// TestHostIDNamespaces: a process on this host in this process's namespaces
// publishes the same identity, so the automatic backend connects it
// through shared memory; one in a network namespace of its own (as in a
// separate container) publishes another, so it is treated as another host.
func TestHostIDNamespaces(t *testing.T) {
	child := func(flags uintptr) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHostID$")
		cmd.Env = append(os.Environ(), hostIDHelperEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
		out, err := cmd.Output()
		if err != nil {
			return "", err
		}
		for _, l := range strings.Split(string(out), "\n") {
			if id, ok := strings.CutPrefix(l, "HOSTID "); ok {
				return id, nil
			}
		}
		t.Fatalf("the child printed no identity: %q", out)
		return "", nil
	}
	mine := localHostID()
	same, err := child(0)
	if err != nil {
		t.Fatal(err)
	}
	if same != mine {
		t.Fatalf("a child in the same namespaces publishes %q, this process %q", same, mine)
	}
	other, err := child(syscall.CLONE_NEWNET)
	if errors.Is(err, syscall.EPERM) {
		t.Skip("creating a network namespace needs CAP_SYS_ADMIN; the rule itself is checked by TestPlanHosts")
	}
	if err != nil {
		t.Fatal(err)
	}
	if other == mine || other == "" {
		t.Fatalf("a child in its own network namespace publishes %q, this process %q: want another, non-empty identity", other, mine)
	}
	t.Logf("this process: %s; in a new network namespace: %s", mine, other)
}
