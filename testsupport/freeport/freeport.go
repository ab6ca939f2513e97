// Package freeport picks TCP ports free on 127.0.0.1, for the brokers and
// containers that the scripts and the test helpers start.
package freeport

import (
	"fmt"
	"net"
)

// Ports returns n distinct ports free on 127.0.0.1 when it returns: every
// listener stays open until all are chosen. Another process may take one
// before the caller binds it.
func Ports(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
