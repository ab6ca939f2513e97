package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/srctree"
)

// privateKafkaScript returns the path of the script that runs a private
// broker or cluster, or skips (or, with EOS_REQUIRE_SERVICES=1, fails) tb
// when one cannot run here.
func privateKafkaScript(tb testing.TB, what, rel string) string {
	tb.Helper()
	if os.Getenv(integration.KafkaBrokersEnv) == "" && !integration.ServicesRequired() {
		// A private broker takes a minute or more to start and bounce:
		// like every service, it runs when the services are up (make
		// test), not in a quick `go test ./...`.
		integration.ServiceMissing(tb, what, localBrokerHowTo,
			fmt.Errorf("no services configured (%s and %s are unset)", integration.KafkaBrokersEnv, integration.RequireServicesEnv))
	}
	script, err := srctree.Find(rel)
	if err != nil {
		integration.ServiceMissing(tb, what, localBrokerHowTo, err)
	}
	if _, err := exec.LookPath("java"); err != nil && os.Getenv("JAVA_HOME") == "" {
		integration.ServiceMissing(tb, what, localBrokerHowTo, err)
	}
	return script
}

// startPrivate runs script's start on stateDir and connects to the
// bootstrap addresses it prints last (KAFKA_BROKERS=a[,b,c]).
func startPrivate(tb testing.TB, script, stateDir string) *integration.KafkaCluster {
	tb.Helper()
	return startPrivateWith(tb, script, stateDir, plaintext)
}

// security is how a private broker's clients connect.
type security int8

const (
	plaintext security = iota
	// saslACLs: SASL/SCRAM-SHA-512 and ACLs (EOSKIT_KAFKA_SASL=1).
	saslACLs
	// saslTLS: saslACLs over TLS, SASL_SSL (EOSKIT_KAFKA_TLS=1).
	saslTLS
)

// securityEnv is the scripts' environment for sec.
func securityEnv(sec security) []string {
	switch sec {
	case saslACLs:
		return []string{"EOSKIT_KAFKA_SASL=1"}
	case saslTLS:
		return []string{"EOSKIT_KAFKA_TLS=1"}
	}
	return nil
}

// startPrivateWith is startPrivate that, with sasl, asks the script for a
// broker or cluster with SASL and ACLs (and TLS) and connects as its
// super user (admin.sasl in its state folder; over TLS, trusting the CA
// the script made, tls/ca.pem).
func startPrivateWith(tb testing.TB, script, stateDir string, sec security) *integration.KafkaCluster {
	tb.Helper()
	env := securityEnv(sec)
	out, err := runScriptEnv(context.Background(), script, stateDir, env, "start")
	if err != nil && lostPort(stateDir, err.Error()+out) {
		// Another process took a port between the script choosing it
		// and the broker binding it: once more, on fresh ports (the
		// script chooses them once per state folder).
		tb.Logf("testbed: %s start lost a port to another process; starting again on fresh ports: %v", filepath.Base(script), err)
		if _, err := runScriptEnv(context.Background(), script, stateDir, env, "stop"); err != nil {
			tb.Fatalf("testbed: stop %s after a lost port: %v", filepath.Base(script), err)
		}
		entries, rerr := os.ReadDir(stateDir)
		for _, e := range entries {
			if rerr == nil {
				rerr = os.RemoveAll(filepath.Join(stateDir, e.Name()))
			}
		}
		if rerr != nil {
			tb.Fatalf("testbed: empty %s for a fresh start: %v", stateDir, rerr)
		}
		out, err = runScriptEnv(context.Background(), script, stateDir, env, "start")
	}
	if err != nil {
		tb.Fatalf("testbed: start %s: %v", filepath.Base(script), err)
	}
	brokers, ok := strings.CutPrefix(strings.TrimSpace(lastLine(out)), integration.KafkaBrokersEnv+"=")
	if !ok {
		tb.Fatalf("testbed: %s start printed no %s line: %q", filepath.Base(script), integration.KafkaBrokersEnv, out)
	}
	if sec == plaintext {
		return integration.KafkaAt(tb, strings.Split(brokers, ","))
	}
	folder := map[bool]string{true: "cluster", false: "kafka"}[strings.HasSuffix(script, "kafka-cluster.sh")]
	b, err := os.ReadFile(filepath.Join(stateDir, folder, "admin.sasl"))
	user, pass, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if err != nil || !ok {
		tb.Fatalf("testbed: %s left no super user's credentials (%v)", filepath.Base(script), err)
	}
	opts := []kgo.Opt{scramOpt(user, pass)}
	if sec == saslTLS {
		opts = append(opts, kgo.DialTLSConfig(TLSConfig(tb, filepath.Join(stateDir, folder, "tls", "ca.pem"))))
	}
	return integration.KafkaAt(tb, strings.Split(brokers, ","), opts...)
}

// TLSConfig is a client TLS configuration trusting the CA certificate
// (PEM) in caFile alone, with the host name checked (franz-go sets the
// server name from the address dialed).
func TLSConfig(tb testing.TB, caFile string) *tls.Config {
	tb.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		tb.Fatalf("testbed: read the CA certificate: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		tb.Fatalf("testbed: %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// lostPort reports whether a broker's start failed on a port another
// process took: said in the script's output, or in a broker log under
// stateDir (the output shows only the logs' last lines).
func lostPort(stateDir, output string) bool {
	const bind = "Address already in use"
	if strings.Contains(output, bind) {
		return true
	}
	found := false
	_ = filepath.WalkDir(stateDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !found && d.Name() == "server.log" {
			b, rerr := os.ReadFile(path)
			found = rerr == nil && strings.Contains(string(b), bind)
		}
		return nil
	})
	return found
}

// runScript runs one of the service scripts on the state folder stateDir.
func runScript(ctx context.Context, script, stateDir string, args ...string) (string, error) {
	return runScriptEnv(ctx, script, stateDir, nil, args...)
}

// runScriptEnv is runScript with env added to the script's environment.
func runScriptEnv(ctx context.Context, script, stateDir string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	// A SASL (or TLS) broker only when asked for here: an
	// EOSKIT_KAFKA_SASL exported in the shell must not turn every private
	// broker into one.
	inherited := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "EOSKIT_KAFKA_SASL=") || strings.HasPrefix(kv, "EOSKIT_KAFKA_TLS=")
	})
	if _, set := os.LookupEnv("EOSKIT_KAFKA_JVM_OPTS"); !set {
		// A private broker lives for a test or two: compiled by C1
		// alone, its JVM starts on about half the CPU (3 CPU-seconds
		// to ready instead of 5.5), which a make test starting dozens
		// of them on two cores needs more than the peak speed C2 would
		// reach later. make chaos sets the variable (empty) to keep C2.
		inherited = append(inherited, "EOSKIT_KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=1")
	}
	cmd.Env = append(append(inherited, env...), "EOSKIT_STATE_DIR="+stateDir,
		// The broker must not outlive this test binary, however it ends.
		"EOSKIT_OWNER_PID="+strconv.Itoa(os.Getpid()), integration.StartedByTest())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(script), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// ForeignCA makes a CA that signed nothing any broker presents: a client
// TLS configuration trusting it alone, and its certificate (PEM) in a
// file, for tests of a client given the wrong CA.
func ForeignCA(tb testing.TB) (cfg *tls.Config, pemFile string) {
	tb.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "a foreign CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	pemFile = filepath.Join(tb.TempDir(), "foreign-ca.pem")
	if err := os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return TLSConfig(tb, pemFile), pemFile
}
