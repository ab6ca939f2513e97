package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/deadletter"
)

// A table an earlier eoskit created lacks the columns Park writes: Exists
// says so (the runners then refuse to start), and Create adds them.
func TestCreateUpgradesAnEarlierTable(t *testing.T) {
	pool := integration.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE eoskit_dead_letters (
		id bigserial PRIMARY KEY, consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
		"offset" bigint NOT NULL, key bytea, value bytea, error text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
		UNIQUE (consumer_group, topic, partition, "offset"))`); err != nil {
		t.Fatal(err)
	}
	if ok, err := deadletter.Exists(ctx, pool); err != nil || ok {
		t.Fatalf("Exists on the earlier table = %v, %v; want false", ok, err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.Create(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := deadletter.Exists(ctx, pool); err != nil || !ok {
		t.Fatalf("Exists after Create = %v, %v; want true", ok, err)
	}
}

// A parked record comes back from Replay as it went in: key, value (nil
// kept nil), headers (a nil and an empty value kept apart, a binary one
// whole), plus the replayed-from header; a write that fails leaves the
// row parked.
func TestReplayGivesBackTheParkedRecordWhole(t *testing.T) {
	pool := integration.Postgres(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.Create(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
	in := &kgo.Record{Topic: "reports", Partition: 2, Offset: 41, Key: []byte{0, 0xff, 'k'},
		Headers: []kgo.RecordHeader{{Key: "nil"}, {Key: "empty", Value: []byte{}}, {Key: "bin", Value: []byte{0, 0xfe}}}}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return deadletter.Park(ctx, tx, "offsetstore", "g", in, [16]byte{}, errors.New("bad\x00 \xff"), nil)
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("outbox down")
	if n, err := deadletter.Replay(ctx, pool, deadletter.Filter{}, "", func(context.Context, pgx.Tx, ...*kgo.Record) error { return boom }); !errors.Is(err, boom) || n != 0 {
		t.Fatalf("Replay with a failing write = %d, %v; want 0 and its error", n, err)
	}
	var got []*kgo.Record
	n, err := deadletter.Replay(ctx, pool, deadletter.Filter{Group: "g"}, "", func(_ context.Context, _ pgx.Tx, recs ...*kgo.Record) error {
		got = append(got, recs...)
		return nil
	})
	if err != nil || n != 1 || len(got) != 1 {
		t.Fatalf("Replay = %d, %v, %d records; want the one parked record", n, err, len(got))
	}
	r := got[0]
	if r.Topic != "reports" || string(r.Key) != string(in.Key) || r.Value != nil || len(r.Headers) != 4 {
		t.Fatalf("replayed %+v, want topic reports, key %q, nil value, 3 headers and the replayed-from one", r, in.Key)
	}
	h := r.Headers
	if h[0].Key != "nil" || h[0].Value != nil || h[1].Key != "empty" || h[1].Value == nil || len(h[1].Value) != 0 ||
		string(h[2].Value) != "\x00\xfe" || h[3].Key != deadletter.ReplayedFromHeader {
		t.Fatalf("headers %q, want nil, empty and binary values kept apart, then %s", h, deadletter.ReplayedFromHeader)
	}
	if rows, err := deadletter.List(ctx, pool, deadletter.Filter{}, 10); err != nil || len(rows) != 0 {
		t.Fatalf("List after the replay = %v, %v; want the table empty", rows, err)
	}
}

// The claim dedup made with a park is released by the replay, found in
// its schema whatever the replaying session's search_path; a claim made
// anew by a later copy (the first purged) is left alone; a row parked
// again while the replay runs (the record failed once more) waits for the
// next replay instead of looping; rows an earlier eoskit parked are
// refused unless asked for.
func TestReplayReleasesOnlyTheParksOwnClaim(t *testing.T) {
	pool := integration.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA svc; CREATE TABLE svc.ids (scope text, id bytea, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, id))`); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.MarkClaimTable(ctx, tx, "svc.ids") }); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.Create(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
	// Two parks in the schema svc, each claiming its id in its own
	// transaction, as dedup does.
	for i, id := range []string{"kept", "reclaimed"} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL search_path = svc, public; INSERT INTO ids (scope, id) VALUES ('s', '`+id+`')`); err != nil {
				return err
			}
			return deadletter.Park(ctx, tx, "dedup", "g", &kgo.Record{Topic: "t", Offset: int64(i), Value: []byte(id)}, [16]byte{}, errors.New("bad"),
				&deadletter.Claim{Table: "ids", Scope: "s", ID: []byte(id)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// "reclaimed" was purged, and a later copy claimed it again.
	if _, err := pool.Exec(ctx, `DELETE FROM svc.ids WHERE id = 'reclaimed'; INSERT INTO svc.ids (scope, id, processed_at) VALUES ('s', 'reclaimed', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	// And a row an earlier eoskit parked.
	if _, err := pool.Exec(ctx, `INSERT INTO eoskit_dead_letters (consumer_group, topic, partition, "offset", value, error) VALUES ('old', 't', 0, 9, 'x', 'bad')`); err != nil {
		t.Fatal(err)
	}
	write := func(_ context.Context, tx pgx.Tx, recs ...*kgo.Record) error {
		// Each replayed record fails again at once and is parked anew.
		for _, r := range recs {
			if err := deadletter.Park(ctx, tx, "dedup", "g", &kgo.Record{Topic: "t", Offset: 100 + int64(len(r.Value)), Value: r.Value}, [16]byte{}, errors.New("again"), nil); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := deadletter.Replay(ctx, pool, deadletter.Filter{}, "", write); !errors.Is(err, deadletter.ErrEarlierRows) {
		t.Fatalf("Replay over a row an earlier eoskit parked = %v, want ErrEarlierRows", err)
	}
	n, err := deadletter.Replay(ctx, pool, deadletter.Filter{Group: "g"}, "", write)
	if err != nil || n != 2 {
		t.Fatalf("Replay = %d, %v; want the 2 rows of group g (not the ones parked during it)", n, err)
	}
	var ids []string
	rows, err := pool.Query(ctx, `SELECT convert_from(id, 'UTF8') FROM svc.ids ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "reclaimed" {
		t.Fatalf("claims left %q, want only the later copy's claim of reclaimed", ids)
	}
	var reparked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM eoskit_dead_letters WHERE consumer_group = 'g' AND error = 'again'`).Scan(&reparked); err != nil || reparked != 2 {
		t.Fatalf("%d rows parked again during the replay (err %v), want both left for the next replay", reparked, err)
	}
	if n, err := deadletter.Replay(ctx, pool, deadletter.Filter{Group: "old", Earlier: true}, "", write); err != nil || n != 1 {
		t.Fatalf("Replay of the earlier row when asked = %d, %v; want 1", n, err)
	}
}

// A record of a topic deleted and created again under the same name is
// another record than the old topic's at the same offset: it is parked
// beside it, its key and value kept, on a table Create upgraded as on a
// new one; parking the same record twice still keeps one row. Before,
// ON CONFLICT (group, topic, partition, offset) DO NOTHING kept the old
// topic's row, and the new record was counted as parked and kept nowhere
// (issue 43 item 14, failing on 3bfa998).
func TestARecreatedTopicsRecordIsParkedBesideTheOld(t *testing.T) {
	for _, upgraded := range []bool{false, true} {
		t.Run(fmt.Sprintf("upgraded=%v", upgraded), func(t *testing.T) {
			pool := integration.Postgres(t)
			ctx := context.Background()
			if upgraded {
				if _, err := pool.Exec(ctx, `CREATE TABLE eoskit_dead_letters (
					id bigserial PRIMARY KEY, consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
					"offset" bigint NOT NULL, key bytea, value bytea, error text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
					UNIQUE (consumer_group, topic, partition, "offset"))`); err != nil {
					t.Fatal(err)
				}
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.Create(ctx, tx) }); err != nil {
				t.Fatal(err)
			}
			park := func(id [16]byte, value string) {
				t.Helper()
				rec := &kgo.Record{Topic: "orders", Partition: 0, Offset: 5, Value: []byte(value)}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return deadletter.Park(ctx, tx, "offsetstore", "g", rec, id, errors.New("bad"), nil)
				}); err != nil {
					t.Fatal(err)
				}
			}
			park([16]byte{1}, "old topic's")
			park([16]byte{1}, "old topic's")        // read again after an offset reset
			park([16]byte{2}, "new topic's")        // the topic created again
			park([16]byte{}, "an old broker's")     // no topic ID named
			park([16]byte{}, "an old broker's too") // the same record again, as far as can be told
			park([16]byte{3}, "the same, with an ID now")
			rows, err := pool.Query(ctx, `SELECT convert_from(value, 'UTF8') FROM eoskit_dead_letters ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			values, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			// The last: a record parked without a topic ID (an earlier
			// eoskit, a broker before 3.1), read again once IDs are
			// named, is the same record, not parked twice.
			if want := []string{"old topic's", "new topic's", "an old broker's"}; !slices.Equal(values, want) {
				t.Fatalf("parked %q, want %q", values, want)
			}
		})
	}
}

// Rows of the dead-letter table are writable by every runner's role, and
// a replay runs with the operator's rights: it releases a claim only in a
// table its owner marked as a dedup claim table (dedup's Migrate does),
// and refuses a row naming any other, deleting nothing. Before, any table
// with the claim's columns was deleted from (issue 47 item 8, failing on
// a0c3743).
func TestReplayReleasesClaimsOnlyInClaimTables(t *testing.T) {
	pool := integration.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA other; CREATE TABLE other.ledger (scope text, id bytea, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, id));
		INSERT INTO other.ledger (scope, id, processed_at) VALUES ('s', 'victim', '2026-01-01')`); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return deadletter.Create(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
	// A row forged by a role that may write the table, naming the ledger.
	if _, err := pool.Exec(ctx, `INSERT INTO eoskit_dead_letters (consumer_group, topic, partition, "offset", value, error, parked_by, claim_schema, claim_table, claim_scope, claim_id, created_at)
		VALUES ('g', 't', 0, 1, 'x', 'bad', 'dedup', 'other', 'ledger', 's', 'victim', '2026-01-01')`); err != nil {
		t.Fatal(err)
	}
	write := func(context.Context, pgx.Tx, ...*kgo.Record) error { return nil }
	if _, err := deadletter.Replay(ctx, pool, deadletter.Filter{Group: "g"}, "", write); err == nil {
		t.Error("a row naming a table no dedup Migrate marked was replayed")
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM other.ledger`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("the ledger holds %d rows (%v), want its 1: the replay deleted from a table it does not know", left, err)
	}
}

// A marked claim table its owner gave a trigger (code that a replay's
// DELETE would run with the operator's rights) is refused too.
func TestReplayRefusesAClaimTableWithATrigger(t *testing.T) {
	pool := integration.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ids (scope text, id bytea, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, id));
		CREATE TABLE witness (n int);
		CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO witness VALUES (1); RETURN OLD; END $$;
		CREATE TRIGGER noted BEFORE DELETE ON ids FOR EACH ROW EXECUTE FUNCTION note();
		INSERT INTO ids (scope, id, processed_at) VALUES ('s', 'x', '2026-01-01')`); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := deadletter.Create(ctx, tx); err != nil {
			return err
		}
		return deadletter.MarkClaimTable(ctx, tx, "ids")
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO eoskit_dead_letters (consumer_group, topic, partition, "offset", value, error, parked_by, claim_schema, claim_table, claim_scope, claim_id, created_at)
		VALUES ('g', 't', 0, 1, 'x', 'bad', 'dedup', 'public', 'ids', 's', 'x', '2026-01-01')`); err != nil {
		t.Fatal(err)
	}
	write := func(context.Context, pgx.Tx, ...*kgo.Record) error { return nil }
	if _, err := deadletter.Replay(ctx, pool, deadletter.Filter{Group: "g"}, "", write); err == nil {
		t.Error("a claim table with a trigger was deleted from")
	}
	var fired int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM witness`).Scan(&fired); err != nil || fired != 0 {
		t.Fatalf("the trigger ran %d times (%v), want never", fired, err)
	}
}
