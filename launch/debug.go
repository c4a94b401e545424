package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/internal/errs"
)

// The variables that turn on Tandem's debugging aids.
const (
	// DebugEnv sets the debug level: OFF, INFO or DETAIL.
	DebugEnv = "TANDEM_DEBUG"
	// TorchDebugEnv is PyTorch's spelling of DebugEnv, read when DebugEnv
	// is not set.
	TorchDebugEnv = "TORCH_DISTRIBUTED_DEBUG"
	// FlightDirEnv names the directory that flight-recorder dumps go to.
	FlightDirEnv = "TANDEM_FLIGHT_DIR"
)

// DebugLevel is how much a process reports about its collectives.
type DebugLevel int

// The debug levels, in increasing detail.
const (
	// DebugOff logs nothing beyond warnings; the flight recorder still
	// keeps the last operations of every group (without stacks).
	DebugOff DebugLevel = iota
	// DebugInfo logs rendezvous, group creation and DDP's bucket layout,
	// and dumps the flight record on SIGUSR1.
	DebugInfo
	// DebugDetail adds a log line for every collective, and the flight
	// recorder keeps the stack of the code that issued each one.
	DebugDetail
)

// String returns the level as the variables spell it.
func (l DebugLevel) String() string {
	switch l {
	case DebugOff:
		return "OFF"
	case DebugInfo:
		return "INFO"
	case DebugDetail:
		return "DETAIL"
	}
	return fmt.Sprintf("DebugLevel(%d)", int(l))
}

// ParseDebugLevel reads OFF, INFO or DETAIL (any case; "" is OFF).
func ParseDebugLevel(s string) (DebugLevel, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "", "OFF", "0":
		return DebugOff, nil
	case "INFO", "1":
		return DebugInfo, nil
	case "DETAIL", "2":
		return DebugDetail, nil
	}
	return DebugOff, fmt.Errorf("%w: launch: debug level %q: want OFF, INFO or DETAIL", errs.InvalidArgument, s)
}

// Debug is the debugging configuration found in the environment.
type Debug struct {
	// Level is the debug level; Source the variable it came from ("" when
	// neither was set).
	Level  DebugLevel
	Source string
	// FlightDir is where flight-recorder dumps go: $TANDEM_FLIGHT_DIR, else
	// a directory under os.TempDir() named after the run
	// (tandem-flight-RUNID, with TANDEM_RUN_ID or TORCHELASTIC_RUN_ID),
	// else after this process (tandem-flight-PID), where every rank of a
	// job started without a run id dumps into a directory of its own.
	FlightDir string
}

// DebugFrom reads TANDEM_DEBUG (else TORCH_DISTRIBUTED_DEBUG),
// TANDEM_FLIGHT_DIR and the run id through lookup (os.LookupEnv, or a
// test's map). An unknown level is an error wrapping ErrInvalidArgument
// that names the variable.
func DebugFrom(lookup func(string) (string, bool)) (Debug, error) {
	var d Debug
	for _, name := range []string{DebugEnv, TorchDebugEnv} {
		v, ok := lookup(name)
		if !ok {
			continue
		}
		l, err := ParseDebugLevel(v)
		if err != nil {
			return Debug{}, fmt.Errorf("%w: launch: %s=%q: want OFF, INFO or DETAIL", errs.InvalidArgument, name, v)
		}
		d.Level, d.Source = l, name
		break
	}
	d.FlightDir = flightDir(lookup)
	return d, nil
}

// DebugFromEnv is DebugFrom(os.LookupEnv).
func DebugFromEnv() (Debug, error) { return DebugFrom(os.LookupEnv) }

func flightDir(lookup func(string) (string, bool)) string {
	if v, ok := lookup(FlightDirEnv); ok && v != "" {
		return v
	}
	for _, name := range []string{RunIDEnv, "TORCHELASTIC_RUN_ID"} {
		if v, ok := lookup(name); ok && v != "" {
			return filepath.Join(os.TempDir(), "tandem-flight-"+sanitize(v))
		}
	}
	return filepath.Join(os.TempDir(), "tandem-flight-"+strconv.Itoa(os.Getpid()))
}

// sanitize keeps a run id usable as a file name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
