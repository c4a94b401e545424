package main

// Flag parsing shared by the benchmarks: lists of positive numbers, buffer
// sizes with K/M/G suffixes, the layer sizes of an MLP.

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/tandemml/tandem/internal/bytesize"
)

// defaultMLPSizes are the layer sizes of the MLP that the training
// benchmarks use unless -sizes says otherwise.
const defaultMLPSizes = "784,1024,1024,10"

// mlpSizesUsage is the help text of their -sizes flag.
const mlpSizesUsage = "comma-separated layer `sizes` of the MLP"

// mlpStepFlags are the flags of the single-process MLP training benchmarks
// (`tandem bench graph`, `tandem bench train`): -sizes, -batch and -steps.
type mlpStepFlags struct {
	sizes        *string
	batch, steps *int
}

// addMLPStepFlags defines -sizes, -batch (default 64) and -steps (default
// steps, help text stepsUsage) on fs.
func addMLPStepFlags(fs *flag.FlagSet, steps int, stepsUsage string) mlpStepFlags {
	return mlpStepFlags{
		sizes: fs.String("sizes", defaultMLPSizes, mlpSizesUsage),
		batch: fs.Int("batch", 64, "batch size"),
		steps: fs.Int("steps", steps, stepsUsage),
	}
}

// layerSizes checks the parsed flags and returns the layer sizes.
func (f mlpStepFlags) layerSizes() ([]int, error) {
	sizes, err := parseLayerSizes(*f.sizes)
	if err != nil {
		return nil, err
	}
	if *f.batch < 1 || *f.steps < 1 {
		return nil, errors.New("-batch and -steps must be positive")
	}
	return sizes, nil
}

// parseBenchFlags parses args into fs and refuses positional arguments.
func parseBenchFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// parseInts parses a comma-separated list of positive numbers, "1,16,256".
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseLayerSizes parses the -sizes flag of an MLP benchmark: at least two
// positive layer sizes, input first.
func parseLayerSizes(s string) ([]int, error) {
	sizes, err := parseInts(s)
	if err != nil || len(sizes) < 2 {
		return nil, fmt.Errorf("-sizes: %q is not a list of at least two positive sizes", s)
	}
	return sizes, nil
}

// parseSizes parses "4K,64K,1M" into byte counts (suffixes K, M, G: KiB,
// MiB, GiB) that are whole elements of elem bytes.
func parseSizes(s string, elem int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		b, err := bytesize.Parse(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("-sizes: %w", err)
		}
		if b%elem != 0 {
			return nil, fmt.Errorf("-sizes: %d bytes is not a whole number of %d-byte elements", b, elem)
		}
		out = append(out, b)
	}
	return out, nil
}
