package comm_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/transport"
	"gorgonia.org/tensor"
)

// judgedTransport is a transport that can say it failed a peer as
// unresponsive (as comm/tcp's does), with the verdict set by the test.
type judgedTransport struct {
	transport.Transport
	verdict atomic.Pointer[error]
}

func (j *judgedTransport) PeerError(rank int) error {
	if e := j.verdict.Load(); e != nil && rank == 1 {
		return *e
	}
	return nil
}

// When a collective's deadline ends while rank 1 has not joined, the error
// says "never joined (… a different number of collectives?)" only when
// the transport has nothing against rank 1: once it has failed rank 1 as
// unresponsive, that is what the error reports.
func TestUnresponsivePeerIsNotCalledAMismatch(t *testing.T) {
	for _, judged := range []bool{false, true} {
		t.Run(fmt.Sprintf("judged=%v", judged), func(t *testing.T) {
			ts, err := local.NewTransports(2)
			if err != nil {
				t.Fatal(err)
			}
			defer ts[1].Close()
			jt := &judgedTransport{Transport: ts[0]}
			if judged {
				lost := fmt.Errorf("%w: tcp: rank 0: rank 1 is unresponsive: nothing received for 5s (since 12:00:00.000)", comm.ErrPeerLost)
				jt.verdict.Store(&lost)
			}
			pg, err := comm.NewProcessGroup(context.Background(), jt)
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			x := tensor.New(tensor.WithShape(4), tensor.Of(tensor.Float32))
			err = pg.AllReduce(ctx, x, comm.Sum).Wait(context.Background())
			if err == nil {
				t.Fatal("the collective succeeded without rank 1")
			}
			never := strings.Contains(err.Error(), "never joined")
			unresponsive := strings.Contains(err.Error(), "rank 1 is unresponsive")
			if judged && (never || !unresponsive || !errors.Is(err, comm.ErrPeerLost)) {
				t.Fatalf("rank 1 was failed as unresponsive, but the error reads %v", err)
			}
			if !judged && (!never || unresponsive) {
				t.Fatalf("rank 1 is merely absent, but the error reads %v", err)
			}
			if errors.Is(err, comm.ErrMismatch) {
				t.Fatalf("an absent rank is not a mismatch: %v", err)
			}
		})
	}
}
