// Package bytesize reads sizes written as a whole number of bytes with an
// optional binary suffix, K, M or G (KiB, MiB, GiB), as the benchmarks'
// flags take them and as Linux's sysfs writes cache sizes ("512K").
package bytesize

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by every error Parse returns.
var ErrSyntax = errors.New("not a size")

// Parse returns the bytes s names: a positive decimal integer, optionally
// followed by K, M or G.
func Parse(s string) (int, error) {
	num, mult := s, 1
	switch {
	case strings.HasSuffix(s, "K"):
		num, mult = strings.TrimSuffix(s, "K"), 1<<10
	case strings.HasSuffix(s, "M"):
		num, mult = strings.TrimSuffix(s, "M"), 1<<20
	case strings.HasSuffix(s, "G"):
		num, mult = strings.TrimSuffix(s, "G"), 1<<30
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > math.MaxInt/mult {
		return 0, fmt.Errorf("%q is %w: write a positive number of bytes, optionally with K, M or G (KiB, MiB, GiB)", s, ErrSyntax)
	}
	return n * mult, nil
}
