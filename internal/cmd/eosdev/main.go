// Command eosdev holds the small pieces of the service scripts under scripts/
// that are easier to get right in Go than in shell: picking free loopback
// ports, and waiting until a Kafka broker really answers a Metadata request.
//
//	eosdev freeport [N]                 prints N (default 1) free TCP ports on 127.0.0.1
//	eosdev wait-kafka -brokers B [-timeout 120s]
//
// It is internal to eoskit's own tooling; users never import or run it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "freeport":
		err = freePorts(os.Args[2:])
	case "wait-kafka":
		err = waitKafka(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "eosdev:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: eosdev freeport [N] | eosdev wait-kafka -brokers host:port [-timeout 120s]")
	os.Exit(2)
}

// freePorts holds every listener open until all are chosen, so that the N
// ports it prints are distinct.
func freePorts(args []string) error {
	n := 1
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 {
			return fmt.Errorf("freeport: %q is not a positive count", args[0])
		}
		n = v
	}
	ports := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("freeport: %w", err)
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, " "))
	return nil
}

// waitKafka returns once the broker answers Metadata and lists itself, which
// only happens after a KRaft broker has been unfenced by its controller.
func waitKafka(args []string) error {
	fs := flag.NewFlagSet("wait-kafka", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap address, host:port[,host:port]")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *brokers == "" {
		return errors.New("wait-kafka: -brokers is required")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*brokers, ",")...))
	if err != nil {
		return fmt.Errorf("wait-kafka: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var lastErr error
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 3*time.Second)
		md, err := adm.BrokerMetadata(reqCtx)
		reqCancel()
		if err == nil && len(md.Brokers) > 0 {
			return nil
		}
		if err == nil {
			err = errors.New("metadata lists no broker yet")
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait-kafka: %s did not answer Metadata within %s: %w", *brokers, *timeout, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
