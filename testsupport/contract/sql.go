package contract

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Strings is a database World's reader: the first column of query's
// rows, as strings.
func Strings(t *testing.T, pool *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Count is a database World's Settled: the effects in table plus the
// dead letters of group in eoskit_dead_letters.
func Count(t *testing.T, pool *pgxpool.Pool, table, group string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+`) +
		(SELECT count(*) FROM eoskit_dead_letters WHERE consumer_group = $1)`, group).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Fail is a database World's answer to a *DatabaseError: it fails tx's
// statement with the error's SQLSTATE and returns the handler's error.
func Fail(ctx context.Context, tx pgx.Tx, e *DatabaseError) error {
	if len(e.Code) != 5 || strings.Trim(e.Code, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		return fmt.Errorf("contract: %q is no SQLSTATE", e.Code)
	}
	_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'contract' USING ERRCODE = '`+e.Code+`'; END $$`)
	return fmt.Errorf("updating the stock: %w", err)
}

// Texts runs query, which selects an id and a text, and returns the texts
// by id.
func Texts(t *testing.T, pool *pgxpool.Pool, query string, args ...any) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	var id, text string
	if _, err := pgx.ForEachRow(rows, []any{&id, &text}, func() error { texts[id] = text; return nil }); err != nil {
		t.Fatal(err)
	}
	return texts
}
