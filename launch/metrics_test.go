package launch

import (
	"errors"
	"testing"

	"github.com/tandemml/tandem/internal/errs"
)

func TestWorkerMetricsAddr(t *testing.T) {
	for _, tc := range []struct {
		base  string
		local int
		want  string
	}{
		{"127.0.0.1:9100", 0, "127.0.0.1:9100"},
		{"127.0.0.1:9100", 3, "127.0.0.1:9103"},
		{":9100", 1, ":9101"},
		{"[::1]:9100", 2, "[::1]:9102"},
		{"localhost:0", 5, "localhost:0"},
	} {
		got, err := WorkerMetricsAddr(tc.base, tc.local)
		if err != nil || got != tc.want {
			t.Errorf("WorkerMetricsAddr(%q, %d) = %q, %v; want %q", tc.base, tc.local, got, err, tc.want)
		}
	}
	for _, base := range []string{"9100", "h:x", "h:-1", "h:70000"} {
		if _, err := WorkerMetricsAddr(base, 0); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("WorkerMetricsAddr(%q, 0): %v, want an invalid argument", base, err)
		}
	}
	if _, err := WorkerMetricsAddr("h:65535", 1); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("a port past 65535 was accepted: %v", err)
	}
	if a, ok := MetricsAddr(func(string) (string, bool) { return "", true }); ok {
		t.Errorf("an empty %s read as %q", MetricsAddrEnv, a)
	}
	if a, ok := MetricsAddr(func(k string) (string, bool) { return "h:1", k == MetricsAddrEnv }); !ok || a != "h:1" {
		t.Errorf("MetricsAddr = %q, %v; want h:1", a, ok)
	}
}
