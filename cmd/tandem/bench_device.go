package main

import (
	"flag"
	"fmt"
)

// deviceUsage is the help text of the training benchmarks' -device flag.
const deviceUsage = "`device` the step runs on: cpu, or cuda (needs a build with -tags tandemcuda and a GPU)"

// addDeviceFlag defines -device (default cpu) on fs.
func addDeviceFlag(fs *flag.FlagSet) *string { return fs.String("device", "cpu", deviceUsage) }

// checkDevice accepts -device cpu, and -device cuda where this binary can
// run bench on the GPU (cudaUnavailable, which the tandemcuda tag decides).
func checkDevice(name, bench string) error {
	switch name {
	case "cpu":
		return nil
	case "cuda":
		return cudaUnavailable(bench)
	}
	return fmt.Errorf("-device %q: want cpu or cuda", name)
}
