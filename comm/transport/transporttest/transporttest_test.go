package transporttest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/comm/transport/transporttest"
)

// brokenEnv makes TestHelperBrokenTransport run the kit on a transport
// that breaks the contract.
const brokenEnv = "TANDEM_TRANSPORTTEST_BROKEN"

// lenient hides the length check of the transport under it: a receive into
// a buffer of another length than the message reports success.
type lenient struct{ transport.Transport }

func (l lenient) Recv(ctx context.Context, peer int, tag transport.Tag, buf []byte) error {
	if err := l.Transport.Recv(ctx, peer, tag, buf); !errors.Is(err, transport.ErrMismatch) {
		return err
	}
	return nil
}

// TestHelperBrokenTransport is not a test: TestKitCatchesABrokenTransport
// runs it in a process of its own, where it is expected to fail.
func TestHelperBrokenTransport(t *testing.T) {
	if os.Getenv(brokenEnv) == "" {
		t.Skip("runs only inside TestKitCatchesABrokenTransport")
	}
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		ts := transporttest.Connect(t, local.Backend{}, n, nil)
		for r := range ts {
			ts[r] = lenient{ts[r]}
		}
		return ts
	})
}

// TestKitCatchesABrokenTransport: the kit fails a transport that hides a
// length mismatch, in that case, and passes it in the cases the breach does
// not touch.
func TestKitCatchesABrokenTransport(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBrokenTransport$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), brokenEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the kit passed a transport that hides length mismatches:\n%s", out)
	assert.Contains(t, string(out), "--- FAIL: TestHelperBrokenTransport/LengthMismatch")
	assert.Contains(t, string(out), "--- PASS: TestHelperBrokenTransport/OrderPerTag")
	assert.Contains(t, string(out), "--- PASS: TestHelperBrokenTransport/ConcurrentTagsAllPairs")
}
