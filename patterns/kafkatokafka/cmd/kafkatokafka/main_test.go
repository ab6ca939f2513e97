package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
	"github.com/eoskit/eoskit/testsupport/httpcheck"
)

// Without -instance the command refuses to start, saying why, rather than
// take the host name, which changes at every restart in a Deployment or a
// container and with it the transactional id (issue 47 item 5; on
// 3bfa998 it started with the host name).
func TestInstanceIsRequired(t *testing.T) {
	bin := t.TempDir() + "/kafkatokafka"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-brokers", "127.0.0.1:1").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "-instance is required") {
		t.Fatalf("without -instance: %v\n%s\nwant exit 2 saying -instance is required", err, out)
	}
}

// The program is production-shaped (issue 47 item 7; on 7d16fbd it had no
// -http or -dead-letter-topic): it answers the probes and serves its
// metrics, and with -dead-letter-topic a report that does not parse goes
// to that topic while the reports around it are forwarded once; without
// it (the negative control) the same report stops the program, naming it.
func TestTheProgramServesItsProbesAndParksABadReport(t *testing.T) {
	k := integration.Kafka(t)
	input, output, deadLetters := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
	bad := &kgo.Record{Topic: input, Value: []byte("not a report")}
	k.Produce(input,
		dashboard.Report{ID: "r1", Region: "north", Cases: 3}.Record(input),
		bad,
		dashboard.Report{ID: "r2", Region: "south", Cases: 4}.Record(input))
	config := func(t *testing.T) kafkatokafka.Config {
		return kafkatokafka.Config{Brokers: k.Brokers, Group: integration.UniqueName(t, "group"), Instance: "kafkatokafka-0",
			Input: input, Output: output, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}

	t.Run("without -dead-letter-topic the bad report stops it", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		err := run(ctx, "", config(t))
		var rerr *eoskit.RecordError
		if !errors.As(err, &rerr) || !strings.Contains(err.Error(), `"not a report"`) {
			t.Fatalf("run returned %v, want a *eoskit.RecordError for the bad report", err)
		}
	})

	t.Run("with -dead-letter-topic it goes on, and answers the probes", func(t *testing.T) {
		cfg := config(t)
		cfg.DeadLetterTopic = deadLetters
		addr := httpcheck.FreeAddr(t)
		defer httpcheck.Background(t, func(ctx context.Context) error { return run(ctx, addr, cfg) })()

		var ids []string
		integration.WaitFor(t, 2*time.Minute, "the bad report dead-lettered and the others forwarded", func() (bool, error) {
			ids = nil
			for _, r := range k.ReadNow(output, kgo.ReadCommitted(), 5*time.Second) {
				rep, err := dashboard.Parse(r.Value)
				if err != nil {
					return false, err
				}
				ids = append(ids, rep.ID)
			}
			return len(ids) >= 2 && len(k.ReadNow(deadLetters, kgo.ReadCommitted(), 5*time.Second)) == 1, nil
		})
		if slices.Sort(ids); !slices.Equal(ids, []string{"r1", "r2"}) {
			t.Fatalf("the output holds %v, want r1 and r2 once each", ids)
		}
		integration.WaitFor(t, time.Minute, "/readyz answering 200", func() (bool, error) {
			code, _ := httpcheck.Get("http://" + addr + "/readyz")
			return code == http.StatusOK, nil
		})
		if code, body := httpcheck.Get("http://" + addr + "/healthz"); code != http.StatusOK || !strings.Contains(body, `"path":"eos"`) {
			t.Errorf("/healthz: %d %s", code, body)
		}
		if code, body := httpcheck.Get("http://" + addr + "/metrics"); code != http.StatusOK ||
			!strings.Contains(body, `eoskit_processor_transactions_total{outcome="committed",path="eos"`) ||
			!strings.Contains(body, `eoskit_processor_dead_letters_total{path="eos"} 1`) ||
			!strings.Contains(body, "go_goroutines") {
			t.Errorf("/metrics: %d, without the runner's and the runtime's series:\n%s", code, body)
		}
	})
}
