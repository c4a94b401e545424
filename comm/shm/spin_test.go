package shm_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/shm"
)

// TestWithSpin: the configured poll reaches the transport (also where the
// ranks outnumber the CPUs: polls yield the CPU), a negative one counts as
// none, and a transport that sleeps at once still carries messages both
// ways.
func TestWithSpin(t *testing.T) {
	cases := []struct {
		name string
		opts []shm.Option
		want time.Duration
	}{
		{"default", nil, 50 * time.Microsecond},
		{"20us", []shm.Option{shm.WithSpin(20 * time.Microsecond)}, 20 * time.Microsecond},
		{"zero", []shm.Option{shm.WithSpin(0)}, 0},
		{"negative", []shm.Option{shm.WithSpin(-time.Second)}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.want
			ts := pairWith(t, c.opts...)
			for r, tr := range ts {
				if got := tr.Spin(); got != want {
					t.Errorf("rank %d polls %v, want %v", r, got, want)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			msg := []byte("ping")
			errc := make(chan error, 1)
			go func() { errc <- ts[0].Send(ctx, 1, 7, msg) }()
			got := make([]byte, len(msg))
			if err := ts[1].Recv(ctx, 0, 7, got); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("received %q, sent %q", got, msg)
			}
		})
	}
}
