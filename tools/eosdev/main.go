// Command eosdev holds the small pieces of the service scripts under scripts/
// that are easier to get right in Go than in shell: picking free loopback
// ports, and waiting until a Kafka broker really answers a Metadata request.
//
//	eosdev freeport [N]                 prints N (default 1) free TCP ports on 127.0.0.1
//	eosdev wait-kafka -brokers B [-min-brokers N] [-node-id ID] [-timeout 120s] [-sasl-file F] [-tls-ca F]
//	eosdev wait-isr -brokers B [-timeout 120s] [-sasl-file F] [-tls-ca F]
//	eosdev jwks -key private.pem -kid ID -out jwks.json   writes the JWKS of an RSA key (the TLS broker's OAUTHBEARER key set)
//
// -sasl-file names a file holding a SCRAM-SHA-512 user name and password, one
// a line (a broker with ACLs, scripts/kafka.sh with EOSKIT_KAFKA_SASL=1).
//
// It is internal to eoskit's own tooling; users never import or run it.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eoskit/eoskit/testsupport/freeport"
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
	case "wait-isr":
		err = waitISR(os.Args[2:])
	case "jwks":
		err = writeJWKS(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "eosdev:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: eosdev freeport [N] | eosdev wait-kafka -brokers host:port [-min-brokers N] [-timeout 120s] | eosdev wait-isr -brokers host:port [-timeout 120s] | eosdev jwks -key private.pem -kid ID -out jwks.json")
	os.Exit(2)
}

// freePorts prints N distinct free ports (freeport.Ports).
func freePorts(args []string) error {
	n := 1
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 {
			return fmt.Errorf("freeport: %q is not a positive count", args[0])
		}
		n = v
	}
	ports, err := freeport.Ports(n)
	if err != nil {
		return fmt.Errorf("freeport: %w", err)
	}
	words := make([]string, len(ports))
	for i, p := range ports {
		words[i] = strconv.Itoa(p)
	}
	fmt.Println(strings.Join(words, " "))
	return nil
}

// client connects to brokers, with SCRAM-SHA-512 when saslFile names the
// credentials, and over TLS trusting the CA certificate in caFile when it
// is set.
func client(brokers, saslFile, caFile string) (*kgo.Client, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	}
	if saslFile != "" {
		b, err := os.ReadFile(saslFile)
		if err != nil {
			return nil, err
		}
		user, pass, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if !ok {
			return nil, fmt.Errorf("%s: want a user and a password, one a line", saslFile)
		}
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	}
	return kgo.NewClient(opts...)
}

// waitKafka returns once the broker answers Metadata and lists itself, which
// only happens after a KRaft broker has been unfenced by its controller.
func waitKafka(args []string) error {
	fs := flag.NewFlagSet("wait-kafka", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap address, host:port[,host:port]")
	minBrokers := fs.Int("min-brokers", 1, "how many brokers Metadata must list")
	nodeID := fs.Int("node-id", -1, "a node Metadata must list as a live broker (a restarted node lists itself only once unfenced)")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait")
	saslFile := fs.String("sasl-file", "", "a file with a SCRAM-SHA-512 user and password, one a line")
	caFile := fs.String("tls-ca", "", "connect over TLS, trusting the CA certificate (PEM) in this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *brokers == "" {
		return errors.New("wait-kafka: -brokers is required")
	}
	cl, err := client(*brokers, *saslFile, *caFile)
	if err != nil {
		return fmt.Errorf("wait-kafka: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var lastErr error
	for {
		// A raw Metadata request: kadm's BrokerMetadata may answer from
		// the client's cache, which can miss brokers that joined since.
		reqCtx, reqCancel := context.WithTimeout(ctx, 3*time.Second)
		md, err := kmsg.NewPtrMetadataRequest().RequestWith(reqCtx, cl)
		reqCancel()
		listed := *nodeID < 0
		if err == nil {
			for _, b := range md.Brokers {
				listed = listed || b.NodeID == int32(*nodeID)
			}
			if len(md.Brokers) >= *minBrokers && listed {
				return nil
			}
			err = fmt.Errorf("metadata lists %d brokers (want %d), node %d listed: %v", len(md.Brokers), *minBrokers, *nodeID, listed)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait-kafka: %s did not answer Metadata within %s: %w", *brokers, *timeout, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitISR returns once every partition of every topic (internal ones
// included) has all its replicas in sync: after a broker came back, the
// cluster is whole again only then, and a rolling restart must not take the
// next broker down before.
func waitISR(args []string) error {
	fs := flag.NewFlagSet("wait-isr", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap address, host:port[,host:port]")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait")
	saslFile := fs.String("sasl-file", "", "a file with a SCRAM-SHA-512 user and password, one a line")
	caFile := fs.String("tls-ca", "", "connect over TLS, trusting the CA certificate (PEM) in this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cl, err := client(*brokers, *saslFile, *caFile)
	if err != nil {
		return fmt.Errorf("wait-isr: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var last string
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 3*time.Second)
		md, err := adm.Metadata(reqCtx)
		reqCancel()
		if err == nil {
			last = ""
			for _, t := range md.Topics.Sorted() {
				for _, p := range t.Partitions.Sorted() {
					if p.Err != nil || len(p.ISR) < len(p.Replicas) || p.Leader < 0 {
						last = fmt.Sprintf("%s[%d]: leader %d, isr %v of replicas %v, err %v", t.Topic, p.Partition, p.Leader, p.ISR, p.Replicas, p.Err)
						break
					}
				}
				if last != "" {
					break
				}
			}
			if last == "" {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait-isr: not every partition is fully in sync after %s (last: %s)", *timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
