// Package dashboard is the domain every reference pattern speaks: regional
// case reports, summed into the per-region totals a real-time dashboard
// shows. The totals must be exact: a report applied twice inflates its
// region's count, and a report lost deflates it, so every delivery anomaly
// shows in the numbers the dashboard prints.
//
// A report travels as a Kafka record keyed by its region (so that one
// region's reports keep their order) with the value "id|region|cases", or
// "id|region|cases|reported_at" (RFC 3339) when it says when it was
// reported. In
// PostgreSQL it is a row of <tables>_reports, and its cases are added to its
// region's row of <tables>_totals in the same transaction. In Kafka, the
// totals are a stateful eos.Processor's sums ([Cases] per region), each a
// record keyed by its region with the total as decimal text; the counts
// per region per day are a windowed one's (eos.WindowedSum of [Cases] by
// [ReportedAt] over [Days]), each keyed by the region and the day's start
// (window.AppendKey).
package dashboard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/window"
)

// DefaultTables is the prefix of the dashboard's tables when a pattern's
// Config names none: dashboard_reports and dashboard_totals.
const DefaultTables = "dashboard"

// Report is one regional case report.
type Report struct {
	ID     string
	Region string
	Cases  int
	// ReportedAt is when the case was reported (the zero time: not
	// said; [ReportedAt] then takes the record's timestamp). A report
	// may arrive long after it: the day it counts in is this one's.
	ReportedAt time.Time
}

// Days are the windows the dashboard counts cases in: a day each, by
// [ReportedAt] in UTC, taking reports up to an hour after the day ends
// (later ones are late, and counted in no day), kept 31 days (what the
// dashboard shows).
var Days = window.Spec{Size: 24 * time.Hour, Advance: 24 * time.Hour, Grace: time.Hour, Retention: 31 * 24 * time.Hour}

// Value encodes r as a record value: "id|region|cases", with
// "|reported_at" (RFC 3339, milliseconds) when r has a ReportedAt.
func (r Report) Value() []byte {
	v := fmt.Appendf(nil, "%s|%s|%d", r.ID, r.Region, r.Cases)
	if !r.ReportedAt.IsZero() {
		v = append(v, '|')
		v = r.ReportedAt.UTC().AppendFormat(v, "2006-01-02T15:04:05.000Z07:00")
	}
	return v
}

// Record returns r as a record for topic, keyed by its region.
func (r Report) Record(topic string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(r.Region), Value: r.Value()}
}

// Parse decodes [Report.Value].
func Parse(b []byte) (Report, error) {
	parts := strings.Split(string(b), "|")
	if len(parts) != 3 && len(parts) != 4 {
		return Report{}, fmt.Errorf("dashboard: %q is not id|region|cases[|reported_at]", b)
	}
	cases, err := strconv.Atoi(parts[2])
	if err != nil {
		return Report{}, fmt.Errorf("dashboard: %q: %w", b, err)
	}
	rep := Report{ID: parts[0], Region: parts[1], Cases: cases}
	if len(parts) == 4 {
		if rep.ReportedAt, err = time.Parse(time.RFC3339Nano, parts[3]); err != nil {
			return Report{}, fmt.Errorf("dashboard: %q: reported_at: %w", b, err)
		}
	}
	return rep, nil
}

// MaxAhead is how far after its record's timestamp a report may say it
// was reported (clocks disagree): [ReportedAt] refuses a later time, as
// Kafka 4 refuses a record timestamped more than an hour ahead. A time
// far ahead would move its partition's stream time there, close every
// day of the region at once and make every later report late.
const MaxAhead = time.Hour

// ReportedAt returns when the report in rec was reported: its ReportedAt,
// or rec's timestamp for a report that does not say. It is the event time
// the counts per day go by (eos.EventTime(dashboard.ReportedAt)). A
// record that is not a report, or a time before 1970 or more than
// MaxAhead after rec's timestamp, is an error (the record's fault).
func ReportedAt(rec *kgo.Record) (time.Time, error) {
	rep, err := Parse(rec.Value)
	switch {
	case err != nil:
		return time.Time{}, err
	case rep.ReportedAt.IsZero():
		return rec.Timestamp, nil
	case rep.ReportedAt.Before(time.Unix(0, 0)):
		return time.Time{}, fmt.Errorf("dashboard: report %s was reported at %s, before 1970", rep.ID, rep.ReportedAt.Format(time.RFC3339))
	case !rec.Timestamp.IsZero() && rep.ReportedAt.After(rec.Timestamp.Add(MaxAhead)):
		return time.Time{}, fmt.Errorf("dashboard: report %s says it was reported at %s, more than %s after its record was written (%s)",
			rep.ID, rep.ReportedAt.Format(time.RFC3339), MaxAhead, rec.Timestamp.UTC().Format(time.RFC3339))
	}
	return rep.ReportedAt, nil
}

// Cases returns the cases of the report in rec: the number an aggregation
// adds to the total of rec's key, its region (eos.Sum(dashboard.Cases)
// keeps the totals in Kafka; see package kafkatokafka).
func Cases(rec *kgo.Record) (int64, error) {
	rep, err := Parse(rec.Value)
	return int64(rep.Cases), err
}

// DB is what the dashboard's statements run on: a pool, a connection or a
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Migrate creates the dashboard's tables, named after the prefix tables, if
// they do not exist. <tables>_reports has no unique key on purpose: the
// pattern, not a constraint, keeps each report once, and a duplicate would
// show as a second row and a wrong total. Replicas may run it at once.
func Migrate(ctx context.Context, db DB, tables string) error {
	reports, totals := names(tables)
	// One simple-protocol query, so one implicit transaction: the
	// advisory lock serializes the replicas that start together, whose
	// CREATE TABLE IF NOT EXISTS of the same table could otherwise both
	// go ahead and one of them fail.
	_, err := db.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.dashboard.migrate'));
		CREATE TABLE IF NOT EXISTS `+reports+` (seq bigserial PRIMARY KEY, id text NOT NULL, region text NOT NULL, cases integer NOT NULL);
		CREATE TABLE IF NOT EXISTS `+totals+` (region text PRIMARY KEY, cases bigint NOT NULL)`)
	if err != nil {
		return fmt.Errorf("dashboard: create tables %s: %w", tables, err)
	}
	return nil
}

// Apply stores the report in rec and adds its cases to its region's total,
// in tx: both happen if and only if tx commits.
func Apply(ctx context.Context, tx pgx.Tx, tables string, rec *kgo.Record) error {
	rep, err := Parse(rec.Value)
	if err != nil {
		return err
	}
	reports, totals := names(tables)
	if _, err := tx.Exec(ctx, `INSERT INTO `+reports+` (id, region, cases) VALUES ($1, $2, $3)`, rep.ID, rep.Region, rep.Cases); err != nil {
		return fmt.Errorf("dashboard: store report %s: %w", rep.ID, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+totals+` (region, cases) VALUES ($1, $2)
		ON CONFLICT (region) DO UPDATE SET cases = `+totals+`.cases + EXCLUDED.cases`, rep.Region, rep.Cases); err != nil {
		return fmt.Errorf("dashboard: add report %s to %s: %w", rep.ID, rep.Region, err)
	}
	return nil
}

// Totals reads the per-region totals: what the dashboard shows.
func Totals(ctx context.Context, db DB, tables string) (map[string]int, error) {
	_, totals := names(tables)
	rows, err := db.Query(ctx, `SELECT region, cases FROM `+totals)
	if err != nil {
		return nil, fmt.Errorf("dashboard: read totals: %w", err)
	}
	t := map[string]int{}
	var region string
	var cases int
	if _, err := pgx.ForEachRow(rows, []any{&region, &cases}, func() error {
		t[region] = cases
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dashboard: read totals: %w", err)
	}
	return t, nil
}

func names(tables string) (reports, totals string) {
	return pgx.Identifier{tables + "_reports"}.Sanitize(), pgx.Identifier{tables + "_totals"}.Sanitize()
}
