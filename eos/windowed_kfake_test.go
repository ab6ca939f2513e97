package eos_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eosprom"
	"github.com/eoskit/eoskit/verify"
	"github.com/eoskit/eoskit/window"
)

var day0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// windowedRun runs a windowed count of in (one partition, on kfake) over
// the reports (key, time) given, in order, until each is handled, and
// returns the processor's state view as it stopped, the records of the
// updates and dead-letter topics, and the late records counted.
type windowedRun struct {
	updates, deadLetters, finals []*kgo.Record
	windows                      map[string][]string // key → "start=count" of its windows in the store
	late                         float64
}

type report struct {
	key string
	at  time.Time
}

func runWindowed(t *testing.T, spec window.Spec, reports []report, opts ...eos.WindowOption) windowedRun {
	t.Helper()
	return runWindowedOn(t, windowCluster(t), spec, reports, opts...)
}

// windowCluster is a kfake cluster with the topics runWindowedOn uses.
func windowCluster(t *testing.T) []string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "reports", "updates", "dead-letters", "finals"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster.ListenAddrs()
}

// runWindowedOn is runWindowed on brokers, whose reports topic may hold
// reports of an earlier run (its changelog their state).
func runWindowedOn(t *testing.T, brokers []string, spec window.Spec, reports []report, opts ...eos.WindowOption) windowedRun {
	t.Helper()
	h, err := eos.WindowedCount(spec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return runAggregationOn(t, brokers, h, reports, windowOf)
}

// windowOf names a windowed key of the store as "start=" (its value
// follows), or fails.
func windowOf(key []byte) (string, string, error) {
	k, start, err := window.SplitKey(key)
	return string(k), start.UTC().Format("01-02T15:04"), err
}

// runAggregationOn runs h, a windowed aggregation, as runWindowedOn does;
// name splits the store's keys into the key and its window's name;
// inspect, if any, reads the state view before the processor stops.
func runAggregationOn(t *testing.T, brokers []string, h eos.HandlerFunc, reports []report, name func([]byte) (string, string, error), inspect ...func(*eos.StateView)) windowedRun {
	t.Helper()
	seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	ctx := context.Background()
	adm := kadm.NewClient(seed)
	ends, err := adm.ListEndOffsets(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup("reports", 0)
	total := end.Offset + int64(len(reports))
	for _, r := range reports {
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(r.key), Timestamp: r.at}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	m, err := eosprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	txnID, _ := eos.StableTransactionalID("windows", "0")
	p, err := eos.NewProcessor(h, eos.Brokers(brokers...), eos.Group("windows"), eos.Topics("reports"), eos.TransactionalID(txnID),
		eos.CommitInterval(20*time.Millisecond), eos.OnHandlerError(eos.DeadLetter("dead-letters")), eos.WithMetrics(m),
		eos.Changelog("windows-changelog", eos.CreateChangelog(), eos.EmitUpdates("updates")), eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		offsets, err := adm.FetchOffsets(ctx, "windows")
		if o, ok := offsets.Lookup("reports", 0); err == nil && ok && o.At == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the processor did not commit the reports up to offset %d within 30 s", total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The offsets' commit shows before the store takes the transaction's
	// writes, and the view leaves out a partition while it restores or
	// before it is assigned (under load a session restart can come after
	// the commit): wait until the store of partition 0 holds what the
	// changelog holds, its checkpoint at the changelog's end but the last
	// commit marker. Fresh make tests read an empty view, and the state
	// of the transaction before, when this waited for Health alone.
	for {
		cp, err := p.State().Checkpoint(0)
		ends, lerr := adm.ListEndOffsets(ctx, "windows-changelog")
		end, ok := ends.Lookup("windows-changelog", 0)
		if p.Health().Ready() && err == nil && lerr == nil && ok && cp.Offset+1 >= end.Offset {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the processor's store of partition 0 did not reach the changelog's end within 30 s (checkpoint %v, %v; end %v, %v; restoring %v)",
				cp, err, end, lerr, p.Health().Restoring)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, fn := range inspect {
		fn(p.State())
	}
	out := windowedRun{windows: map[string][]string{}}
	_ = p.State().Range(func(_ int32, key, value []byte) bool {
		k, w, err := name(key)
		if err != nil {
			t.Errorf("the store holds %q, no window's key", key)
			return true
		}
		out.windows[k] = append(out.windows[k], fmt.Sprintf("%s=%s", w, value))
		return true
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	out.late = testutil.ToFloat64(lateCounter(t, reg))
	out.updates = readCommitted(t, brokers, "updates")
	out.deadLetters = readCommitted(t, brokers, "dead-letters")
	out.finals = readCommitted(t, brokers, "finals")
	return out
}

// lateCounter is eosprom's late_records_total series of path "eos".
func lateCounter(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "late"})
	for _, f := range families {
		if f.GetName() == "eoskit_processor_late_records_total" {
			for _, m := range f.GetMetric() {
				c.Add(m.GetCounter().GetValue())
			}
		}
	}
	return c
}

// readCommitted reads topic read_committed up to its last stable offsets
// now (verify.ReadTopicWith): what is committed, whatever a fetch's pace
// (a reader that stopped at the first quiet half second missed a slow
// partition's records under load).
func readCommitted(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	recs, err := verify.ReadTopicWith(context.Background(), []kgo.Opt{kgo.SeedBrokers(brokers...)}, topic, kgo.ReadCommitted(), false, false, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// lastByKey is each windowed key's last value in recs ("nil" for a
// tombstone), as "key@MM-DDTHH:MM".
func lastByKey(t *testing.T, recs []*kgo.Record) map[string]string {
	t.Helper()
	last := map[string]string{}
	for _, r := range recs {
		k, start, err := window.SplitKey(r.Key)
		if err != nil {
			t.Fatalf("an update keyed %q, no window's", r.Key)
		}
		v := string(r.Value)
		if r.Value == nil {
			v = "nil"
		}
		last[fmt.Sprintf("%s@%s", k, start.UTC().Format("01-02T15:04"))] = v
	}
	return last
}

func at(d string) time.Time {
	dur, err := time.ParseDuration(d)
	if err != nil {
		panic(err)
	}
	return day0.Add(dur)
}

// Reports out of order on one partition: each counts in its window while
// stream time (the latest report's time) has not passed the window's end
// plus grace; a report later than that is late: counted nowhere, counted
// as late, and, with ReturnLate and a dead-letter policy, dead-lettered
// with a reason that says so. The updates topic carries one update per
// window changed, keyed as Kafka Streams keys windows.
func TestWindowedCountFollowsStreamTime(t *testing.T) {
	t.Parallel()
	spec := window.Tumbling(time.Minute, 30*time.Second)
	spec.Retention = time.Hour
	got := runWindowed(t, spec, []report{
		{"a", at("10s")},
		{"a", at("50s")},
		{"b", at("1m5s")},  // stream time 01:05
		{"a", at("40s")},   // window 00:00 open until 01:30: counted
		{"a", at("2m")},    // stream time 02:00
		{"a", at("59s")},   // window 00:00 closed at 01:30: late
		{"b", at("1m31s")}, // window 00:01 open until 02:30: counted
	}, eos.ReturnLate())
	want := map[string][]string{"a": {"12-01T00:00=3", "12-01T00:02=1"}, "b": {"12-01T00:01=2"}}
	if !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v", got.windows, want)
	}
	if got.late != 1 {
		t.Fatalf("%v late records counted, want 1", got.late)
	}
	if len(got.deadLetters) != 1 || !strings.Contains(headerOf(got.deadLetters[0], "eoskit-error"), "late record") ||
		headerOf(got.deadLetters[0], "eoskit-source-offset") != "5" {
		t.Fatalf("dead letters %s; want the report at offset 5 (00:00:59), its error naming it late", describe(got.deadLetters))
	}
	if updates := lastByKey(t, got.updates); !mapsEqual(updates, map[string]string{"a@12-01T00:00": "3", "a@12-01T00:02": "1", "b@12-01T00:01": "2"}) {
		t.Fatalf("the updates end at %v", updates)
	}
}

// Windows leave the store, the changelog and the updates (a tombstone)
// once stream time passes their start plus retention; a late record is
// dropped, not dead-lettered, without ReturnLate.
func TestWindowsExpireByStreamTime(t *testing.T) {
	t.Parallel()
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = 2 * time.Minute
	got := runWindowed(t, spec, []report{
		{"a", at("10s")},
		{"a", at("1m10s")},
		{"a", at("2m10s")}, // window 00:00 expires at 02:00
		{"b", at("3m30s")}, // window 00:01 at 03:00
		{"a", at("2m50s")}, // window 00:02 closed at 03:00: late, dropped
	})
	want := map[string][]string{"a": {"12-01T00:02=1"}, "b": {"12-01T00:03=1"}}
	if !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v", got.windows, want)
	}
	if updates := lastByKey(t, got.updates); !mapsEqual(updates, map[string]string{"a@12-01T00:00": "nil", "a@12-01T00:01": "nil", "a@12-01T00:02": "1", "b@12-01T00:03": "1"}) {
		t.Fatalf("the updates end at %v; want tombstones for the expired windows", updates)
	}
	if got.late != 1 || len(got.deadLetters) != 0 {
		t.Fatalf("%v late, %d dead letters; want 1 late and none dead-lettered", got.late, len(got.deadLetters))
	}
}

// A window expires when stream time passes its start plus retention, even
// when no window start lies in between: Tumbling(1m, 20s) keeps a window
// 80 s, so the window of 00:00 goes at 01:20, between two starts.
func TestWindowsExpireBetweenWindowStarts(t *testing.T) {
	t.Parallel()
	got := runWindowed(t, window.Tumbling(time.Minute, 20*time.Second), []report{
		{"a", at("10s")},
		{"b", at("1m5s")},  // window 00:00 open until 01:20
		{"b", at("1m25s")}, // window 00:00 expires at 01:20
	})
	want := map[string][]string{"b": {"12-01T00:01=2"}}
	if !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v", got.windows, want)
	}
}

// Stream time restores with the state: a processor started after another
// committed (its store restored from the changelog) finds late a report
// that is late only against the stream time the first one left.
func TestStreamTimeRestoresWithTheState(t *testing.T) {
	t.Parallel()
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = time.Hour
	brokers := windowCluster(t)
	first := runWindowedOn(t, brokers, spec, []report{{"a", at("10s")}, {"a", at("5m")}})
	if first.late != 0 {
		t.Fatalf("the first run found %v late", first.late)
	}
	second := runWindowedOn(t, brokers, spec, []report{{"a", at("20s")}}) // late against 00:05
	want := map[string][]string{"a": {"12-01T00:00=1", "12-01T00:05=1"}}
	if second.late != 1 || !equalWindows(second.windows, want) {
		t.Fatalf("after a restart: %v late, the store holds %v; want the report of 00:00:20 late and %v", second.late, second.windows, want)
	}
}

// With EmitFinal, each window's final count goes out once, when stream
// time reaches its end plus grace, not before; a restarted processor
// (stream time and windows restored) emits the windows that close after,
// and none again.
func TestFinalResultsOnceWhenWindowsClose(t *testing.T) {
	t.Parallel()
	spec := window.Tumbling(time.Minute, 30*time.Second)
	spec.Retention = time.Hour
	brokers := windowCluster(t)
	first := runWindowedOn(t, brokers, spec, []report{
		{"a", at("10s")},
		{"a", at("50s")},
		{"b", at("1m5s")},
		{"a", at("40s")},
		{"a", at("2m")},    // window 00:00 closed at 01:30: final a=3
		{"b", at("1m31s")}, // window 00:01 open until 02:30
		{"c", at("3m")},    // window 00:01 closed: final b=2; 00:02 open until 03:30
	}, eos.EmitFinal("finals"))
	if got := describeFinals(t, first.finals); got != "a@12-01T00:00=3 b@12-01T00:01=2" {
		t.Fatalf("finals after the first run: %s", got)
	}
	second := runWindowedOn(t, brokers, spec, []report{{"d", at("3m40s")}}, eos.EmitFinal("finals"))
	if got := describeFinals(t, second.finals); got != "a@12-01T00:00=3 b@12-01T00:01=2 a@12-01T00:02=1" {
		t.Fatalf("finals after the restart: %s; want the window of 00:02 added, nothing again", got)
	}
}

// Hopping windows with the default retention (size + grace): windows
// close and expire in the same jump of stream time, and each final still
// goes out once, before its window leaves the store.
func TestFinalsOfHoppingWindowsThatCloseAndExpireAtOnce(t *testing.T) {
	t.Parallel()
	got := runWindowed(t, window.Hopping(2*time.Minute, time.Minute, 0), []report{
		{"a", at("30s")},   // windows 23:59 and 00:00
		{"a", at("2m10s")}, // both close and expire; windows 00:01 and 00:02
		{"b", at("4m30s")}, // 00:01 and 00:02 close and expire; b's 00:03 and 00:04
	}, eos.EmitFinal("finals"))
	if f := describeFinals(t, got.finals); f != "a@11-30T23:59=1 a@12-01T00:00=1 a@12-01T00:01=1 a@12-01T00:02=1" {
		t.Fatalf("finals %s", f)
	}
	if want := map[string][]string{"b": {"12-01T00:03=1", "12-01T00:04=1"}}; !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v", got.windows, want)
	}
}

// describeFinals lists finals as key@window=count, in order.
func describeFinals(t *testing.T, finals []*kgo.Record) string {
	t.Helper()
	var out []string
	for _, r := range finals {
		k, start, err := window.SplitKey(r.Key)
		if err != nil {
			t.Fatalf("a final keyed %q", r.Key)
		}
		out = append(out, fmt.Sprintf("%s@%s=%s", k, start.UTC().Format("01-02T15:04"), r.Value))
	}
	return strings.Join(out, " ")
}

// A record whose time cannot be had (the extractor fails, or gives a time
// before the Unix epoch) is the record's fault: dead-lettered with its
// cause, the others counted. A record far in the future moves stream time
// there: the records after it, with their true times, are late (the
// documented hazard, which an extractor refusing such times avoids).
func TestEventTimeFaultsAreTheRecords(t *testing.T) {
	t.Parallel()
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = 24 * 365 * 2 * time.Hour
	extract := func(r *kgo.Record) (time.Time, error) {
		switch string(r.Key) {
		case "unreadable":
			return time.Time{}, errors.New("no reported_at field")
		case "before-epoch":
			return time.UnixMilli(-5), nil
		}
		return r.Timestamp, nil
	}
	got := runWindowed(t, spec, []report{
		{"a", at("10s")},
		{"unreadable", at("20s")},
		{"before-epoch", at("30s")},
		{"future", at("8760h")},
		{"a", at("40s")}, // late: stream time is a year ahead
	}, eos.EventTime(extract))
	want := map[string][]string{"a": {"12-01T00:00=1"}, "future": {"12-01T00:00=1"}}
	want["future"] = []string{at("8760h").UTC().Format("01-02T15:04") + "=1"}
	if !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v", got.windows, want)
	}
	var causes []string
	for _, r := range got.deadLetters {
		causes = append(causes, string(r.Key)+": "+headerOf(r, "eoskit-error"))
	}
	if len(causes) != 2 || !strings.Contains(causes[0], "no reported_at field") || !strings.Contains(causes[1], "before the Unix epoch") {
		t.Fatalf("dead letters %q; want the unreadable and the before-epoch records, each with its cause", causes)
	}
	if got.late != 1 {
		t.Fatalf("%v late, want 1 (the record after the future one)", got.late)
	}
}

// An invalid spec, or an empty finals topic, is a ConfigError from the
// constructor.
func TestWindowedSpecIsChecked(t *testing.T) {
	_, err := eos.WindowedCount(window.Spec{Size: time.Minute, Grace: time.Minute, Retention: time.Minute})
	var cfg *eoskit.ConfigError
	if !errors.As(err, &cfg) || cfg.Setting != "WindowedSum" || !errors.Is(err, window.ErrSpec) {
		t.Fatalf("%v; want a ConfigError wrapping window.ErrSpec", err)
	}
	if _, err := eos.WindowedCount(window.Tumbling(time.Minute, 0), eos.EmitFinal("")); !errors.As(err, &cfg) || cfg.Setting != "EmitFinal" {
		t.Fatalf("an empty finals topic: %v", err)
	}
}

func equalWindows(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w := b[k]
		if len(v) != len(w) {
			return false
		}
		seen := map[string]bool{}
		for _, x := range v {
			seen[x] = true
		}
		for _, x := range w {
			if !seen[x] {
				return false
			}
		}
	}
	return true
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// describe lists recs' keys and headers, for a failure's message.
func describe(recs []*kgo.Record) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "[%s", r.Key)
		for _, h := range r.Headers {
			fmt.Fprintf(&b, " %s=%q", h.Key, h.Value)
		}
		b.WriteString("] ")
	}
	return b.String()
}

// What a windowed aggregation cannot run under ends Run at the first
// record with a ConfigError naming the setting, whatever the error
// policy (DeadLetter here), and nothing is dead-lettered: KeyOrder lanes
// (a partition's records out of order, which stream time follows), and a
// finals topic that is the input or the dead-letter topic.
func TestWindowedMisconfigurationIsAConfigError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, setting string
		window        []eos.WindowOption
		processor     []eos.ProcessorOption
	}{
		{"KeyOrder lanes", "Concurrency", nil, []eos.ProcessorOption{eos.Concurrency(4, eos.KeyOrder)}},
		{"finals to the input", "EmitFinal", []eos.WindowOption{eos.EmitFinal("reports")}, nil},
		{"finals to the dead letters", "EmitFinal", []eos.WindowOption{eos.EmitFinal("dead-letters")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "reports", "dead-letters"))
			if err != nil {
				t.Fatal(err)
			}
			defer cluster.Close()
			brokers := cluster.ListenAddrs()
			seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
			if err != nil {
				t.Fatal(err)
			}
			defer seed.Close()
			if err := seed.ProduceSync(context.Background(), &kgo.Record{Key: []byte("a")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			h, err := eos.WindowedCount(window.Tumbling(time.Minute, 0), c.window...)
			if err != nil {
				t.Fatal(err)
			}
			txnID, _ := eos.StableTransactionalID("windows", "0")
			p, err := eos.NewProcessor(h, append([]eos.ProcessorOption{eos.Brokers(brokers...), eos.Group("windows"), eos.Topics("reports"),
				eos.TransactionalID(txnID), eos.OnHandlerError(eos.DeadLetter("dead-letters")),
				eos.Changelog("windows-changelog", eos.CreateChangelog()), eos.Logger(slog.New(slog.DiscardHandler))}, c.processor...)...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = p.Run(ctx)
			var cfg *eoskit.ConfigError
			if !errors.As(err, &cfg) || cfg.Setting != c.setting {
				t.Fatalf("Run returned %v; want a ConfigError naming %s", err, c.setting)
			}
			if dl := readCommitted(t, brokers, "dead-letters"); len(dl) != 0 {
				t.Fatalf("%d records dead-lettered", len(dl))
			}
		})
	}
}

// A record whose handler fails after moving its partition's stream time
// (its value function fails, past the move) leaves the stream time as
// the transaction had it: dead-lettered, its writes are dropped, the
// stream time's with them, and a report after it counts in a window the
// dropped move would have closed. The processor remembers each
// partition's stream time between records (not reading it from the store
// for each): a remembered move of a record that failed would make that
// report late.
func TestAFailedRecordsStreamTimeIsDroppedWithItsWrites(t *testing.T) {
	t.Parallel()
	h, err := eos.WindowedSum(window.Tumbling(time.Minute, 0), func(r *kgo.Record) (int64, error) {
		if string(r.Key) == "poison" {
			return 0, errors.New("no value")
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := runAggregationOn(t, windowCluster(t), h, []report{
		{"a", at("10s")},
		{"poison", at("1h")}, // moves stream time an hour on, then fails
		{"a", at("20s")},
		{"a", at("30s")},
	}, windowOf)
	want := map[string][]string{"a": {"12-01T00:00=3"}}
	if !equalWindows(got.windows, want) {
		t.Fatalf("the store holds %v, want %v (a failed record's stream time kept?)", got.windows, want)
	}
	if len(got.deadLetters) != 1 || string(got.deadLetters[0].Key) != "poison" {
		t.Fatalf("dead letters %v, want the poison record", got.deadLetters)
	}
	if got.late != 0 {
		t.Fatalf("%v late, want none", got.late)
	}
}
