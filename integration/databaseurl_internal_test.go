package integration

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// The URL a test's own database is reached by names that database, whatever
// the shape of the server's URL: no path, a dbname parameter (which would
// override the path), keyword/value. Before, a URL without a path lost its
// host and one with dbname= pointed at the shared database.
func TestDatabaseURLNamesTheTestsDatabase(t *testing.T) {
	for _, server := range []string{
		"postgres://u:p@h:5432/shared?sslmode=disable",
		"postgresql://u:p@h:5432",
		"postgres://u:p@h:5432/shared?dbname=shared&sslmode=disable",
		"postgres://u:p@h1:5432,h2:5433/shared",
		"host=h port=5432 user=u password=p dbname=shared sslmode=disable",
	} {
		got := databaseURL(server, "eoskit_test_1")
		cfg, err := pgx.ParseConfig(got)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", server, got, err)
			continue
		}
		want, _ := pgx.ParseConfig(server)
		if cfg.Database != "eoskit_test_1" || cfg.Host != want.Host || cfg.User != want.User || cfg.Password != want.Password {
			t.Errorf("%s: %q is database %q on %s as %s, want eoskit_test_1 on %s as %s", server, got, cfg.Database, cfg.Host, cfg.User, want.Host, want.User)
		}
	}
}
