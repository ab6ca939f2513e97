package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/outbox"
)

// The reports the dead-letter tests feed: 20 over two partitions, three of
// them poison until the handler is fixed.
const reports, poisoned = 20, 3

func produceReports(t *testing.T, k *integration.KafkaCluster, topic string) {
	t.Helper()
	var recs []*kgo.Record
	for i := range reports {
		v := fmt.Sprintf("report-%02d", i)
		if i%7 == 3 {
			v = fmt.Sprintf("poison-%02d", i)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(v), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: "region", Value: []byte("north")}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.Client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// fixable fails a poison report until fixed is set.
type fixable struct{ fixed atomic.Bool }

func (f *fixable) check(value []byte) error {
	if strings.HasPrefix(string(value), "poison") && !f.fixed.Load() {
		return fmt.Errorf("cannot parse %s", value)
	}
	return nil
}

// eoskitCmd runs the command and returns its exit status and stdout.
func eoskitCmd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, stdout, stderr := eoskitCmdErr(t, args...)
	if stderr != "" {
		t.Logf("eoskit %s: stderr: %s", strings.Join(args[:2], " "), stderr)
	}
	return code, stdout
}

// withoutPassword is url as an operator gives it to -database-url: its
// password moved to a passfile of the test's own (libpq's ~/.pgpass, as
// pgx reads it), off the command line.
func withoutPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	pass, ok := u.User.Password()
	if !ok {
		return raw
	}
	file := filepath.Join(t.TempDir(), "pgpass")
	if err := os.WriteFile(file, []byte("*:*:*:"+u.User.Username()+":"+pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u.User = url.User(u.User.Username())
	q := u.Query()
	q.Set("passfile", file)
	u.RawQuery = q.Encode()
	return u.String()
}

// eoskitCmdErr runs the command and returns its exit status, stdout and
// stderr.
func eoskitCmdErr(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func runUntilEnd(t *testing.T, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("%s did not stop within a minute of its context's end", name)
		}
	})
}

// startRelay readies the outbox of pool's database and runs its relay
// until the test ends.
func startRelay(t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, name string) {
	t.Helper()
	ctx := context.Background()
	var named []outbox.NameOption
	if name != "" {
		named = append(named, outbox.Name(name))
	}
	var migrate []outbox.MigrateOption
	var relay []outbox.Option
	for _, o := range named {
		migrate, relay = append(migrate, o), append(relay, o)
	}
	if err := outbox.Migrate(ctx, pool, migrate...); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool, migrate...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the relay stopped: cleanups run last first
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for range 50 {
			if outbox.DropSlot(ctx, pool, slot) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	r, err := outbox.NewRelay(pool, append(relay, outbox.Brokers(k.Brokers...), outbox.PositionTopic(k.NewTopic(1)))...)
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "the relay", r.Run)
}

// Records parked in the PostgreSQL table by offsetstore and by dedup are
// listed without their values, and replayed through the outbox once the
// handler is fixed: each report is then applied exactly once (dedup's
// claim on a parked record is released, or its replay would be skipped as
// a copy), the table is empty, and a second replay finds nothing; also
// into a named outbox (-outbox), the one a relay of that name publishes.
func TestDeadLettersInTheTableAreListedAndReplayedOnce(t *testing.T) {
	k := integration.Kafka(t)
	for _, tc := range []struct{ path, outbox string }{{"offsetstore", ""}, {"dedup", ""}, {"dedup", "ledger"}} {
		path := tc.path
		t.Run(path+"/"+tc.outbox, func(t *testing.T) {
			pool, url := integration.PostgresWithURL(t)
			url = withoutPassword(t, url)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `CREATE TABLE applied (report text NOT NULL, region text)`); err != nil {
				t.Fatal(err)
			}
			in := k.NewTopic(2)
			group := integration.UniqueName(t, "dl")
			var h fixable
			apply := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
				if err := h.check(r.Value); err != nil {
					return err
				}
				region := ""
				for _, hd := range r.Headers {
					if hd.Key == "region" {
						region = string(hd.Value)
					}
				}
				_, err := tx.Exec(ctx, `INSERT INTO applied (report, region) VALUES ($1, $2)`, string(r.Value), region)
				return err
			}
			switch path {
			case "offsetstore":
				if err := offsetstore.Migrate(ctx, pool); err != nil {
					t.Fatal(err)
				}
				r, err := offsetstore.NewRunner(pool, func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
					for _, rec := range recs {
						if err := apply(ctx, tx, rec); err != nil {
							return err
						}
					}
					return nil
				}, offsetstore.Brokers(k.Brokers...), offsetstore.Group(group), offsetstore.Topics(in), offsetstore.OnHandlerError(offsetstore.DeadLetter()))
				if err != nil {
					t.Fatal(err)
				}
				runUntilEnd(t, "the runner", r.Run)
			case "dedup":
				store, err := dedup.NewPostgresStore("")
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Migrate(ctx, pool); err != nil {
					t.Fatal(err)
				}
				c, err := dedup.NewConsumer(pool, store, apply, dedup.Brokers(k.Brokers...), dedup.Group(group), dedup.Topics(in),
					dedup.ID(dedup.KeyID()), dedup.OnHandlerError(dedup.DeadLetter()),
					dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
				if err != nil {
					t.Fatal(err)
				}
				runUntilEnd(t, "the consumer", c.Run)
			}
			startRelay(t, k, pool, tc.outbox)
			produceReports(t, k, in)
			count := func(q string) int {
				var n int
				if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			waitUntil(t, time.Minute, "every report applied or parked", func() bool {
				return count(`SELECT count(*) FROM applied`) == reports-poisoned && count(`SELECT count(*) FROM eoskit_dead_letters`) == poisoned
			})

			code, out := eoskitCmd(t, "dead-letters", "list", "-database-url", url, "-group", group, "-json")
			var listed []struct {
				Topic string `json:"topic"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(out), &listed); code != exitOK || err != nil || len(listed) != poisoned {
				t.Fatalf("list: exit %d, %d rows (%v), want %d: %s", code, len(listed), err, poisoned, out)
			}
			if code, text := eoskitCmd(t, "dead-letters", "list", "-database-url", url); code != exitOK || !strings.Contains(text, "cannot parse poison-03") || strings.Count(text, "poison-") != poisoned {
				// The error names the value here (the handler's doing);
				// the listing prints no key or value of its own.
				t.Fatalf("list: exit %d, want each of the %d rows once: %s", code, poisoned, text)
			}

			h.fixed.Store(true)
			replay := []string{"dead-letters", "replay", "-database-url", url, "-group", group}
			if tc.outbox != "" {
				replay = append(replay, "-outbox", tc.outbox)
			}
			if code, out := eoskitCmd(t, replay...); code != exitOK || !strings.Contains(out, fmt.Sprintf("replayed %d ", poisoned)) {
				t.Fatalf("replay: exit %d: %s", code, out)
			}
			if n := count(`SELECT count(*) FROM eoskit_dead_letters`); n != 0 {
				t.Fatalf("%d rows left in the table after the replay", n)
			}
			waitUntil(t, time.Minute, "the replayed reports applied", func() bool { return count(`SELECT count(*) FROM applied`) >= reports })
			time.Sleep(2 * time.Second) // a duplicate would land by now
			if n, distinct, north := count(`SELECT count(*) FROM applied`), count(`SELECT count(DISTINCT report) FROM applied`),
				count(`SELECT count(*) FROM applied WHERE region = 'north'`); n != reports || distinct != reports || north != reports {
				t.Fatalf("applied %d reports, %d distinct, %d with their header; want each of the %d once, headers kept", n, distinct, north, reports)
			}
			if code, out, stderr := eoskitCmdErr(t, replay...); code != exitOK || !strings.Contains(out, "replayed 0 ") || strings.Contains(stderr, "no outbox relay reads") {
				t.Fatalf("second replay: exit %d (a relay reads the outbox's slot: no warning): %s%s", code, out, stderr)
			}
			// A relay given outbox.Slot reads another slot: -slot names it
			// for the check (issue 43 item 23).
			if code, _, stderr := eoskitCmdErr(t, append(replay, "-slot", "eoskit_no_relay_here")...); code != exitOK || !strings.Contains(stderr, "slot=eoskit_no_relay_here") {
				t.Fatalf("replay -slot: exit %d, want a warning that no relay reads eoskit_no_relay_here: %s", code, stderr)
			}
		})
	}
}

// Records an eos processor dead-lettered to a Kafka topic are listed, then
// replayed to the topic they were read from, where the fixed processor
// copies them: each report is in the output exactly once, and a second
// replay replays nothing (the replaying group's offsets committed with the
// copies).
func TestDeadLettersInATopicAreListedAndReplayedOnce(t *testing.T) {
	k := integration.Kafka(t)
	in, out, dlq := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
	group := integration.UniqueName(t, "dl")
	txnID, err := eos.StableTransactionalID(group, "0")
	if err != nil {
		t.Fatal(err)
	}
	var h fixable
	p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if err := h.check(r.Value); err != nil {
			return nil, err
		}
		return []*kgo.Record{{Topic: out, Key: r.Key, Value: r.Value}}, nil
	}, eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID), eos.OnHandlerError(eos.DeadLetter(dlq)))
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "the processor", p.Run)
	produceReports(t, k, in)
	waitUntil(t, time.Minute, "every report copied or dead-lettered", func() bool {
		return len(k.ReadNow(out, kgo.ReadCommitted(), 30*time.Second)) == reports-poisoned && len(k.ReadNow(dlq, kgo.ReadCommitted(), 30*time.Second)) == poisoned
	})

	code, listed := eoskitCmd(t, "dead-letters", "list", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq)
	if code != exitOK || strings.Count(listed, in+"[") != poisoned || strings.Contains(listed, "true") {
		t.Fatalf("list: exit %d, want %d records read from %s, none replayed: %s", code, poisoned, in, listed)
	}
	// The processor's own group is refused as the replaying group: the
	// replay would take over its offsets and transactional ids.
	if code, _, stderr := eoskitCmdErr(t, "dead-letters", "replay", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq, "-replay-group", group); code != exitError || !strings.Contains(stderr, "live members") {
		t.Fatalf("replay in the live processor's group: exit %d, %s; want %d, refused for its live members", code, stderr, exitError)
	}
	h.fixed.Store(true)
	if code, text := eoskitCmd(t, "dead-letters", "replay", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq); code != exitOK || !strings.Contains(text, fmt.Sprintf("replayed %d ", poisoned)) {
		t.Fatalf("replay: exit %d: %s", code, text)
	}
	waitUntil(t, time.Minute, "the replayed reports copied", func() bool { return len(k.ReadNow(out, kgo.ReadCommitted(), 30*time.Second)) >= reports })
	if code, text := eoskitCmd(t, "dead-letters", "replay", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq); code != exitOK || !strings.Contains(text, "replayed 0 ") {
		t.Fatalf("second replay: exit %d: %s", code, text)
	}
	time.Sleep(2 * time.Second) // a duplicate would land by now
	seen := map[string]int{}
	for _, r := range k.ReadAll(out, kgo.ReadCommitted(), time.Minute) {
		seen[string(r.Value)]++
	}
	var wrong []string
	for i := range reports {
		for _, v := range []string{fmt.Sprintf("report-%02d", i), fmt.Sprintf("poison-%02d", i)} {
			if n := seen[v]; n > 1 || n == 1 && (i%7 == 3) != strings.HasPrefix(v, "poison") {
				wrong = append(wrong, fmt.Sprintf("%s×%d", v, n))
			}
		}
	}
	if len(seen) != reports || len(wrong) > 0 {
		t.Fatalf("output holds %d distinct reports (want %d, each once): %v", len(seen), reports, wrong)
	}
	if code, listed := eoskitCmd(t, "dead-letters", "list", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq, "-json"); code != exitOK || strings.Count(listed, `"replayed": true`) != poisoned {
		t.Fatalf("list after the replay: exit %d, want all %d replayed: %s", code, poisoned, listed)
	}
}

// An outbox dead letter without its value (too large for Kafka; its
// record lives in the outbox's dead-letter table) is passed by, with a
// warning naming it, and the dead letters after it in its partition are
// replayed. Before, the replaying processor stopped on it for good, and
// every replay after stopped there too (issue 47 item 9, failing on
// 411f3b1).
func TestReplayPassesByAnOutboxDeadLetterKeptInItsTable(t *testing.T) {
	k := integration.Kafka(t)
	dlq, target := k.NewTopic(1), k.NewTopic(1)
	seed := k.Client(kgo.DefaultProduceTopic(dlq))
	if err := seed.ProduceSync(context.Background(),
		&kgo.Record{Headers: []kgo.RecordHeader{{Key: "eoskit-outbox-id", Value: []byte("7")}, {Key: "eoskit-outbox-topic", Value: []byte(target)},
			{Key: "eoskit-outbox-error", Value: []byte("MESSAGE_TOO_LARGE")}, {Key: "eoskit-outbox-value", Value: []byte("omitted (too large); the record is kept in eoskit_outbox_dead_letters")}}},
		&kgo.Record{Value: []byte("after"), Headers: []kgo.RecordHeader{{Key: "eoskit-outbox-id", Value: []byte("8")}, {Key: "eoskit-outbox-topic", Value: []byte(target)},
			{Key: "eoskit-outbox-error", Value: []byte("refused")}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, text, stderr := eoskitCmdErr(t, "dead-letters", "replay", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq)
	if code != exitOK || !strings.Contains(text, "replayed 1 ") || !strings.Contains(text, "passed by 1 ") || !strings.Contains(stderr, "holds no value") {
		t.Fatalf("replay: exit %d, %s%s; want the second dead letter replayed and the first passed by with a warning", code, text, stderr)
	}
	got := k.ReadNow(target, kgo.ReadCommitted(), 30*time.Second)
	if len(got) != 1 || string(got[0].Value) != "after" {
		t.Fatalf("the target holds %d records, want the one dead letter after the kept one", len(got))
	}
}

// A group of Kafka's consumer protocol (KIP-848) with live members is
// refused as the replaying group too: DescribeGroups shows such a group
// without members, so the replay would have joined it.
func TestReplayRefusesALiveConsumerProtocolGroup(t *testing.T) {
	k := integration.Kafka(t)
	in, dlq := k.NewTopic(1), k.NewTopic(1)
	group := integration.UniqueName(t, "kip848")
	txnID, err := eos.StableTransactionalID(group, "0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := eos.NewProcessor(func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
		eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID), eos.ConsumerProtocol())
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "the processor", p.Run)
	waitUntil(t, time.Minute, "the processor to join its consumer-protocol group", func() bool {
		described, err := k.Admin.DescribeConsumerGroups(context.Background(), group)
		return err == nil && len(described[group].Members) > 0
	})
	if code, _, stderr := eoskitCmdErr(t, "dead-letters", "replay", "-brokers", strings.Join(k.Brokers, ","), "-dead-letter-topic", dlq, "-replay-group", group); code != exitError || !strings.Contains(stderr, "live members") {
		t.Fatalf("replay in a live consumer-protocol group: exit %d, %s; want %d, refused for its live members", code, stderr, exitError)
	}
}
