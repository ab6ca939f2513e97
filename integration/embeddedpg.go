package integration

import (
	"context"
	"testing"
	"time"

	"github.com/eoskit/eoskit/testsupport/embeddedpg"
)

// startEmbeddedPostgres is the last place [PostgresServer] looks, after
// DATABASE_URL and Docker: a PostgreSQL server of tb's own, run from the
// zonky binaries Maven Central serves (downloaded once into the user's
// cache directory; as root, run as nobody), stopped and deleted when tb
// ends, so that a user's database tests run with no Docker. It returns
// the URL of a superuser, or an error saying why there is none (offline,
// another OS): [PostgresServer] then skips or fails tb. Each call starts
// a server (about a second once the binaries are cached): a test that
// needs many databases takes them from one server with [Postgres].
func startEmbeddedPostgres(tb testing.TB) (string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // the download's and the start's own bounds are within
	defer cancel()
	s, err := embeddedpg.Start(ctx, embeddedpg.Options{Progress: func(step string) { tb.Logf("integration: embedded PostgreSQL: %s", step) }})
	if err != nil {
		return "", err
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("integration: stop the embedded PostgreSQL: %v", err)
		}
	})
	return s.URL(), nil
}
