package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/errs"
)

func TestDebugFrom(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	for _, c := range []struct {
		env    []string
		level  DebugLevel
		source string
		dir    string
	}{
		{nil, DebugOff, "", filepath.Join(os.TempDir(), "tandem-flight-"+strconv.Itoa(os.Getpid()))},
		{[]string{"TANDEM_DEBUG", "info"}, DebugInfo, DebugEnv, ""},
		{[]string{"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}, DebugDetail, TorchDebugEnv, ""},
		{[]string{"TORCH_DISTRIBUTED_DEBUG", "DETAIL", "TANDEM_DEBUG", "OFF"}, DebugOff, DebugEnv, ""},
		{[]string{"TANDEM_RUN_ID", "job/7"}, DebugOff, "", filepath.Join(os.TempDir(), "tandem-flight-job_7")},
		{[]string{"TORCHELASTIC_RUN_ID", "abc", "TANDEM_FLIGHT_DIR", "/x/y"}, DebugOff, "", "/x/y"},
	} {
		d, err := DebugFrom(env(c.env...))
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if d.Level != c.level || d.Source != c.source || (c.dir != "" && d.FlightDir != c.dir) {
			t.Errorf("%v: got %+v, want level %v source %q dir %q", c.env, d, c.level, c.source, c.dir)
		}
	}
	_, err := DebugFrom(env("TORCH_DISTRIBUTED_DEBUG", "verbose"))
	if !errors.Is(err, errs.InvalidArgument) || !strings.Contains(err.Error(), "TORCH_DISTRIBUTED_DEBUG") {
		t.Fatalf("bad level: %v", err)
	}
	for _, l := range []DebugLevel{DebugOff, DebugInfo, DebugDetail} {
		if back, err := ParseDebugLevel(l.String()); err != nil || back != l {
			t.Errorf("%v does not read back: %v %v", l, back, err)
		}
	}
}
