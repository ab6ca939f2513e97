// Package tests holds no code: its subpackages are test-only suites that
// span every path (tests/chaos: the chaos matrix, soak and KAFKA-20734
// reproduction; tests/leastprivilege: each path under ACLs).
package tests
