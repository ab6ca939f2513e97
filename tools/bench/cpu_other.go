//go:build !unix

package main

import "time"

// processCPU is not measured here: the tables show no CPU figure.
func processCPU() time.Duration { return 0 }
