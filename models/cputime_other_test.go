//go:build !unix

package models_test

import "time"

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }
