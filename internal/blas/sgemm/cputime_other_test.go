//go:build !unix

package sgemm

import "time"

// processCPU is 0 where the system does not say.
func processCPU() time.Duration { return 0 }
