package eos

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/state"
)

// A table partition whose records known to be committed are not fetched
// within the table's timeout stalls prepare with a *TableStallError asking
// for a new session, within that timeout, not a handler's budget; a
// handler meeting a partition prepare did not ready asks for one too,
// never blaming its record.
func TestATableThatCannotBeFetchedStallsBeforeTheHandlers(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	f, err := newTableFollower([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, NewTable("regions", TableRestoreTimeout(time.Second)), kadm.TopicID{}, ExactlyOnce, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()

	// The empty topic is caught up at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.prepare(ctx, 0, 0, 0, time.Now(), time.Second); err != nil {
		t.Fatalf("prepare of an empty table: %v", err)
	}
	// Records said committed up to offset 100 that never come.
	f.mu.Lock()
	f.parts[0].end = 100
	f.mu.Unlock()
	start := time.Now()
	err = f.prepare(ctx, 0, 0, 0, time.Now(), time.Second)
	var stall *TableStallError
	if !errors.As(err, new(*loop.RestartError)) || !errors.As(err, &stall) || stall.Partition != 0 || stall.End != 100 {
		t.Fatalf("prepare with records never fetched: %v, want a RestartError of a TableStallError", err)
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Fatalf("the stall came after %s, want the table's timeout, 1 s", took)
	}

	// A position past the topic's end (the topic created again) is a
	// configuration error, at once.
	if err := f.prepare(ctx, 1, 50, 50, time.Now(), time.Second); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("prepare at a position past the table's end: %v, want a ConfigError", err)
	}

	// A partition no prepare readied: the handler's advance asks for a
	// new session.
	kv := state.NewTxn(state.NewMemory(), 0).Scope()
	if err := f.advance(nil, kv, 3, time.Now()); !errors.As(err, new(*loop.RestartError)) {
		t.Fatalf("advance of a partition never prepared: %v, want a RestartError", err)
	}
}

// A table partition paused with its buffer full is fetched again when
// the stream's time passes what it holds: records written since are met,
// not a table frozen at the pause.
func TestAPausedTablePartitionIsFetchedAgain(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("regions"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	base := time.Now().Add(-time.Hour)
	write := func(from, to int) {
		for i := from; i < to; i++ {
			if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("r"), Value: []byte(strconv.Itoa(i)), Timestamp: base.Add(time.Duration(i) * time.Second)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, 20)
	f, err := newTableFollower([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, NewTable("regions"), kadm.TopicID{}, ExactlyOnce, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	f.maxBuffered = 4
	store := state.NewMemory()
	txn := state.NewTxn(store, 0)
	join := func(at time.Time) string {
		t.Helper()
		pos, _ := tablePosition(txn, "regions", tablePositionKey("regions"))
		if err := f.prepare(ctx, 0, pos, pos, at, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		sc := txn.Scope()
		if err := f.advance(nil, sc, 0, at); err != nil {
			t.Fatal(err)
		}
		sc.Keep()
		v, _, _ := sc.Get(newTableKeys("regions").value([]byte("r")))
		return string(v)
	}
	if got := join(base.Add(2 * time.Second)); got != "2" {
		t.Fatalf("at 2 s: %q, want 2", got)
	}
	// The stream's time passes all 20; meanwhile 20 more were written.
	write(20, 40)
	if got := join(base.Add(time.Hour)); got != "39" {
		t.Fatalf("past every record: %q, want 39 (the table fetched again after its pause)", got)
	}
}

// The keyed state records, beside a table's position, the ID of the
// topic its table came from (absent in state written before: read as
// zero); sameTopic refuses only a recorded ID other than the followed
// topic's, and advance records the followed topic's ID with the records
// it applies, never a zero one over a recorded one.
func TestTableTopicIDUnit(t *testing.T) {
	id := kadm.TopicID{1, 2, 3, 15: 0xff}
	store := state.NewMemory()
	if got, err := tableTopicID(store, "regions"); err != nil || got != (kadm.TopicID{}) {
		t.Fatalf("no ID recorded: read %v, %v; want zero", got, err)
	}
	if err := store.Apply([]state.Write{{Key: tableTopicIDKey("regions"), Value: []byte{1, 2}}}, state.Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := tableTopicID(store, "regions"); err == nil {
		t.Fatal("an ID of two bytes read without an error")
	}
	f := &tableFollower{topic: "regions", keys: newTableKeys("regions"), id: id}
	if err := f.sameTopic(0, id); err != nil {
		t.Errorf("the followed topic's own ID refused: %v", err)
	}
	if err := f.sameTopic(0, kadm.TopicID{}); err != nil {
		t.Errorf("state without an ID refused: %v", err)
	}
	if err := f.sameTopic(2, kadm.TopicID{9}); !errors.Is(err, eoskit.ErrInvalidConfig) || !strings.Contains(err.Error(), "created again") {
		t.Errorf("state of another topic: %v, want a ConfigError saying it was created again", err)
	}
	if err := (&tableFollower{topic: "regions"}).sameTopic(2, kadm.TopicID{9}); err != nil {
		t.Errorf("a follower that knows no ID refused state with one: %v", err)
	}

	// advance records the ID with what it applies; a follower without
	// one leaves a recorded ID as it is.
	kv := state.NewTxn(state.NewMemory(), 0).Scope()
	f.parts = map[int32]*tableBuffer{0: {from: 0, next: 1, end: 1, ready: 1,
		recs: []*kgo.Record{{Key: []byte("r1"), Value: []byte("north"), Offset: 0, Timestamp: time.Unix(1, 0)}}}}
	if err := f.advance(nil, kv, 0, time.Unix(2, 0)); err != nil {
		t.Fatal(err)
	}
	if got, err := tableTopicID(kv, "regions"); err != nil || got != id {
		t.Fatalf("after a record applied, the state records %v (%v), want %v", got, err, id)
	}
	anon := &tableFollower{topic: "regions", keys: newTableKeys("regions"), parts: map[int32]*tableBuffer{0: {from: 0, next: 2, end: 2, ready: 2,
		recs: []*kgo.Record{{Key: []byte("r1"), Value: []byte("south"), Offset: 1, Timestamp: time.Unix(1, 0)}}}}}
	if err := anon.advance(nil, kv, 0, time.Unix(2, 0)); err != nil {
		t.Fatal(err)
	}
	if got, _ := tableTopicID(kv, "regions"); got != id {
		t.Fatalf("a follower without an ID left %v, want %v kept", got, id)
	}
}
