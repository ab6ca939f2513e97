package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// Kafka unreachable (every broker cut off by its proxy) while a lone relay
// has a batch in flight. For three times wal_sender_timeout, well within
// the Kafka transaction timeout: the relay keeps its replication session
// (PostgreSQL does not end it, the relay does not restart) and the batch
// commits once Kafka is back. Then for longer than the transaction
// timeout: nobody fenced the relay, so it rides that out too (Run does
// not return). Every committed record is published once, in order.
func TestKafkaOutageLongerThanWalSenderTimeoutDoesNotStopALoneRelay(t *testing.T) {
	cluster := testbed.StartLocalCluster(t)
	px := cluster.Proxied(t)
	pool, url := integration.PostgresWithURL(t)
	b := newBedOn(t, cluster.KafkaCluster, pool, url)

	// A session of the relay that answers nothing for 3 s is ended by
	// PostgreSQL.
	const walSenderTimeout = 3 * time.Second
	relayPool := poolWithWalSenderTimeout(t, url, walSenderTimeout, nil)

	const txnTimeout = 20 * time.Second
	r, err := outbox.NewRelay(relayPool, outbox.Brokers(px.Brokers...), outbox.PositionTopic(b.positions),
		outbox.Logger(testLogger(t)), outbox.StatusInterval(time.Second),
		outbox.ClientOptions(kgo.TransactionTimeout(txnTimeout)))
	if err != nil {
		t.Fatal(err)
	}
	first := startRelay(t, r)
	done := first.done

	if err := b.load.Write(context.Background(), 200, 2, 10); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first records published", func() bool { return b.published(t) >= 200 })

	// outage cuts Kafka off for d while writers go on (the relay's batch
	// blocks in a Kafka call), then heals it and waits for every
	// committed record on the output; Run must not return meanwhile.
	outage := func(d time.Duration, n int) {
		t.Helper()
		wrote := make(chan error, 1)
		go func() { wrote <- b.load.Write(context.Background(), n, 2, 10) }()
		time.Sleep(300 * time.Millisecond)
		for node := 1; node <= 3; node++ {
			if err := px.Cut(node); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Run returned during a Kafka outage of %s: %v", d, err)
		case <-time.After(d):
		}
		// The outage shows while it lasts (issue 47 item 13: before, Health
		// stayed Healthy with no error through a minute's cut).
		if h := r.Health(); !strings.Contains(h.LastError, "waiting for Kafka") || h.Healthy() {
			t.Fatalf("%s into a Kafka outage, Health shows last error %q, healthy %v; want the wait for Kafka, not healthy", d, h.LastError, h.Healthy())
		}
		held := int64(0)
		for node := 1; node <= 3; node++ {
			held += px.Held(node)
			if err := px.Heal(node); err != nil {
				t.Fatal(err)
			}
		}
		if held == 0 {
			t.Fatal("the cut held no traffic: the relay was not talking to Kafka during the outage")
		}
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the writers did not finish within 2 minutes")
		}
		committed := b.committed(t)
		deadline := time.Now().Add(2 * time.Minute)
		for b.published(t) < len(committed) {
			select {
			case err := <-done:
				done <- err
				t.Fatalf("Run returned after a Kafka outage of %s, with %d of %d records published: %v", d, b.published(t), len(committed), err)
			case <-time.After(200 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d committed records published 2 minutes after Kafka came back", b.published(t), len(committed))
			}
		}
	}

	holder, assigned := b.holder(t), r.Health().LastAssigned
	outage(3*walSenderTimeout, 2000)
	if now, again := b.holder(t), r.Health().LastAssigned; now != holder || !again.Equal(assigned) {
		t.Fatalf("a Kafka outage of %s (3x wal_sender_timeout, within the transaction timeout) ended the relay's replication session: "+
			"the slot was read by pid %d, then %d; the relay last took it at %s, then %s", 3*walSenderTimeout, holder, now,
			assigned.Format(time.TimeOnly), again.Format(time.TimeOnly))
	}
	outage(txnTimeout+15*time.Second, 2000) // past the coordinator's abort sweep (10 s)
	if h := r.Health(); !h.Healthy() {
		t.Fatalf("after the outages, with everything published, Health is not healthy: %+v", h)
	}

	rep := b.verify(t)
	if committed := b.committed(t); rep.Outputs != len(committed) {
		t.Fatalf("%d outputs; want the %d committed records once each", rep.Outputs, len(committed))
	}
	t.Logf("verifier: %v", rep)
	if err := first.stop(); err != nil {
		t.Fatalf("the first relay stopped with %v", err)
	}
}

// RetryFor bounds a wait for Kafka too: a relay given RetryFor(8 s)
// returns, with an error saying so, once Kafka has not taken its batch for
// that long, the end of the transaction under way and then its abort
// having each given up (30 s at most each, Kafka being away); before, Run
// never returned from a produce franz-go retried for ever. Kafka is a
// private broker, killed with a batch in flight.
func TestRetryForBoundsAWaitForKafka(t *testing.T) {
	t.Parallel()
	broker := testbed.StartLocalBroker(t)
	pool, url := integration.PostgresWithURL(t)
	b := newBedOn(t, broker.KafkaCluster, pool, url)
	const txnTimeout = 20 * time.Second
	r, err := outbox.NewRelay(pool, outbox.Brokers(broker.Brokers...), outbox.PositionTopic(b.positions), outbox.Logger(testLogger(t)),
		outbox.RetryFor(8*time.Second), outbox.ClientOptions(kgo.TransactionTimeout(txnTimeout)))
	if err != nil {
		t.Fatal(err)
	}
	done := startRelay(t, r).done
	if err := b.load.Write(context.Background(), 100, 2, 10); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first records published", func() bool { return b.published(t) >= 100 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := broker.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.load.Write(context.Background(), 100, 2, 10); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	select {
	case err := <-done:
		done <- err // for the cleanup's stop
		if !strings.Contains(fmt.Sprint(err), "giving up") || time.Since(cut) < 8*time.Second {
			t.Fatalf("Run returned %v after %s of an outage; want, past RetryFor (8 s), the wait for Kafka named", err, time.Since(cut))
		}
		t.Logf("RetryFor 8 s: Run returned after %s: %v", time.Since(cut).Round(time.Second), err)
	case <-time.After(100 * time.Second):
		t.Fatal("with RetryFor 8 s, Run had not returned 100 s into a Kafka outage")
	}
}

// A relay fenced in Kafka while no other relay holds its slot (here a
// stray producer with its transactional id, after the relay stalled past
// its transaction timeout and PostgreSQL ended its replication session)
// was fenced by no relay: it starts a new session rather than stop, and
// publishes everything once.
func TestRelayFencedWithNoOtherRelayOnTheSlotRestarts(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pool, url := integration.PostgresWithURL(t)
	b := newBedOn(t, k, pool, url)
	relayPool := poolWithWalSenderTimeout(t, url, 2*time.Second, nil)

	txnID := integration.UniqueName(t, "relay")
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r, err := outbox.NewRelay(relayPool, outbox.Brokers(k.Brokers...), outbox.PositionTopic(b.positions),
		outbox.Logger(testLogger(t)), outbox.StatusInterval(500*time.Millisecond), outbox.TransactionalID(txnID),
		outbox.ClientOptions(kgo.TransactionTimeout(3*time.Second)),
		outbox.BeforeCommit(func() { once.Do(func() { close(stalled); <-release }) }))
	if err != nil {
		t.Fatal(err)
	}
	done := startRelay(t, r).done
	if err := b.load.Write(context.Background(), 300, 2, 10); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stalled:
	case <-time.After(time.Minute):
		t.Fatal("the relay never reached a commit")
	}
	// Past the transaction timeout, the relay stops keeping its session
	// alive, and PostgreSQL ends it: nobody holds the slot.
	waitFor(t, 30*time.Second, "the stalled relay's replication session to end", func() bool { return b.holder(t) == 0 })
	stray, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(txnID))
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, _, err = stray.ProducerID(pctx) // fences the relay's producer
	pcancel()
	stray.Close()
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	committed := b.committed(t)
	deadline := time.Now().Add(2 * time.Minute)
	for b.published(t) < len(committed) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Run returned %v, with %d of %d records published; want the relay to restart", err, b.published(t), len(committed))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d committed records published 2 minutes after the stray producer", b.published(t), len(committed))
		}
	}
	if rep := b.verify(t); rep.Outputs != len(committed) {
		t.Fatalf("%d outputs; want the %d committed records once each", rep.Outputs, len(committed))
	}
}
