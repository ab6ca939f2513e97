package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// replicationRole creates a role for one service: LOGIN and REPLICATION,
// no superuser, password "service", with CREATE on the database (for its
// publication) and on schema public (for its tables), as docs/outbox.md
// grants; it is dropped when the test ends.
func replicationRole(t *testing.T, admin *pgxpool.Pool, name string) string {
	t.Helper()
	ctx := context.Background()
	role := strings.NewReplacer("-", "_").Replace(strings.ToLower(integration.UniqueName(t, name)))
	if len(role) > 60 {
		role = role[len(role)-60:]
	}
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+ident+` LOGIN REPLICATION NOSUPERUSER PASSWORD 'service'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE `+ident) })
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `GRANT CREATE ON DATABASE `+pgx.Identifier{db}.Sanitize()+` TO `+ident+`; GRANT CREATE ON SCHEMA public TO `+ident); err != nil {
		t.Fatal(err)
	}
	return role
}

// serviceRole is replicationRole with a pool connecting as it.
func serviceRole(t *testing.T, admin *pgxpool.Pool, url, name string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = replicationRole(t, admin, name), "service"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Two services share a database, each with a role of its own (LOGIN
// REPLICATION, no superuser, the grants docs/outbox.md lists) and an
// outbox of its own: each migrates, relays and publishes its records, and
// neither may touch the other's tables (its relays' heartbeats, its
// slot's token). Before, the second service's relay failed with 42501 on
// the heartbeat and token tables every outbox shared, which the first
// service's role owned (issue 43 item 21, failing on 411f3b1).
func TestTwoServicesWithRolesOfTheirOwnShareADatabase(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	admin, url := integration.PostgresWithURL(t)
	ctx := context.Background()
	positions := k.NewTopic(1)
	type service struct {
		pool  *pgxpool.Pool
		name  outbox.NameOption
		topic string
		ran   chan error
	}
	var services []*service
	for _, name := range []string{"billing", "shipping"} {
		s := &service{pool: serviceRole(t, admin, url, name), name: outbox.Name(name), topic: k.NewTopic(1), ran: make(chan error, 1)}
		if err := outbox.Migrate(ctx, s.pool, s.name); err != nil {
			t.Fatalf("%s: Migrate: %v", name, err)
		}
		slot, err := outbox.DefaultSlot(ctx, s.pool, s.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for range 50 {
				if outbox.DropSlot(ctx, admin, slot) == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
		r, err := outbox.NewRelay(s.pool, s.name, outbox.Brokers(k.Brokers...), outbox.PositionTopic(positions))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		go func() { s.ran <- r.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-s.ran })
		w, err := outbox.NewWriter(s.name)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				return w.Write(ctx, tx, &kgo.Record{Topic: s.topic, Value: fmt.Appendf(nil, "%s-%d", name, i)})
			}); err != nil {
				t.Fatal(err)
			}
		}
		services = append(services, s)
	}
	for _, s := range services {
		deadline := time.Now().Add(time.Minute)
		for len(k.ReadNow(s.topic, kgo.ReadCommitted(), 10*time.Second)) < 10 {
			select {
			case err := <-s.ran:
				t.Fatalf("a relay stopped: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: its records were not published within a minute", s.topic)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Neither may touch the other's heartbeats or tokens.
	for _, table := range []string{"eoskit_outbox_billing_relays", "eoskit_outbox_billing_slots"} {
		_, err := services[1].pool.Exec(ctx, `DELETE FROM `+table)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "42501" {
			t.Errorf("the second service's role deleting from %s: %v, want 42501 (permission denied)", table, err)
		}
	}
}

// A role without a right Migrate needs is refused with the statement and
// the grant that gives it named: here CREATE on the database, for the
// publication. Before, the error was PostgreSQL's alone, "permission
// denied for database" (issue 47 item 12, failing on 411f3b1).
func TestMigrateNamesTheRightItLacks(t *testing.T) {
	t.Parallel()
	admin, url := integration.PostgresWithURL(t)
	pool := serviceRole(t, admin, url, "nodb")
	var db, role string
	if err := admin.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(context.Background(), `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(context.Background(), `REVOKE CREATE ON DATABASE `+pgx.Identifier{db}.Sanitize()+` FROM `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	err := outbox.Migrate(context.Background(), pool, outbox.Name("nodb"))
	if err == nil || !strings.Contains(err.Error(), "CREATE PUBLICATION") || !strings.Contains(err.Error(), "CREATE on the database") {
		t.Fatalf("Migrate without CREATE on the database returned %v; want the statement and the right named", err)
	}
}
