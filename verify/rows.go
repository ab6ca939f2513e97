package verify

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CheckRows checks a results table written by a copier of the copy
// workload: one row per output with columns seq (commit order), id,
// part (input partition) and off (input offset). A duplicate is a second
// row, so the table must have no unique constraint on id.
func CheckRows(ctx context.Context, pool *pgxpool.Pool, table string, inputs []string) (Report, error) {
	outs, err := ReadRows(ctx, pool, table)
	if err != nil {
		return Report{}, err
	}
	return Check(Run{Input: inputs, Output: outs}), nil
}

// ReadRows reads a results table laid out as [CheckRows] expects into the
// verifier's outputs, in commit order, for a [Run] that needs more than
// CheckRows gives (aborted inputs, say).
func ReadRows(ctx context.Context, pool *pgxpool.Pool, table string) ([]Output, error) {
	rows, err := pool.Query(ctx, `SELECT seq, id, part, off FROM `+pgx.Identifier{table}.Sanitize()+` ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	var outs []Output
	var seq, off int64
	var id string
	var part int32
	if _, err := pgx.ForEachRow(rows, []any{&seq, &id, &part, &off}, func() error {
		outs = append(outs, Output{ID: id, Stream: strconv.Itoa(int(part)), Seq: off, Position: Position{Topic: table, Offset: seq}})
		return nil
	}); err != nil {
		return nil, err
	}
	return outs, nil
}
