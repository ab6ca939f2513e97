package patterns

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/verify"
)

// The database patterns write each report as a row (reports has no unique
// constraint: a duplicate is a second row) and add its cases to its
// region's total, the number a dashboard shows.

func exactlyOncePostgres() Pattern {
	return Pattern{
		Name:          "exactly-once kafka→postgres",
		Guarantee:     "offsetstore: rows and offsets in one database transaction",
		NeedsDatabase: true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			if err := offsetstore.Migrate(ctx, l.Pool); err != nil {
				return result{}, err
			}
			return l.postgresPipeline(ctx, p, resume, false, func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func()) error {
				r, err := offsetstore.New(l.Pool,
					func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
						for _, rec := range recs {
							wait()
							if err := applyReport(ctx, tx, tables, rec); err != nil {
								return err
							}
						}
						return nil
					},
					offsetstore.Brokers(l.Brokers...), offsetstore.Group(name), offsetstore.Topics(in),
					offsetstore.MaxPollRecords(200), offsetstore.Logger(l.Logger.With("pattern", p.Name)),
					offsetstore.ClientOptions(clientOpts...),
					offsetstore.DrainTimeout(0)) // a stop acts as a crash (see kafka.go)
				if err != nil {
					return err
				}
				return r.Run(ctx)
			}, func(ctx context.Context, name, _ string) (int64, int64, error) {
				var done int64
				err := l.Pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM eoskit_offsets WHERE consumer_group = $1`, name).Scan(&done)
				return done, 0, err
			})
		},
	}
}

func dedupPostgres() Pattern {
	return Pattern{
		Name:          "effectively-once with dedup",
		Guarantee:     "at-least-once consumer; dedup claims each id with the side effect",
		NeedsDatabase: true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			var store *dedup.PostgresStore
			return l.postgresPipeline(ctx, p, resend, true, func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func()) error {
				c, err := dedup.NewConsumer(l.Pool, store,
					func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
						wait()
						return applyReport(ctx, tx, tables, rec)
					},
					dedup.Brokers(l.Brokers...), dedup.Group(name), dedup.Topics(in), dedup.MaxPollRecords(200),
					dedup.Logger(l.Logger.With("pattern", p.Name)),
					dedup.ClientOptions(append(clientOpts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...),
					dedup.DrainTimeout(0)) // a stop acts as a crash (see kafka.go)
				if err != nil {
					return err
				}
				return c.Run(ctx)
			}, nil, func(ctx context.Context, tables string) error {
				var err error
				if store, err = dedup.NewPostgresStore(tables + "_ids"); err != nil {
					return err
				}
				return store.Migrate(ctx, l.Pool)
			})
		},
	}
}

func applyReport(ctx context.Context, tx pgx.Tx, tables string, rec *kgo.Record) error {
	rep, err := ParseReport(rec.Value)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+tables+`_reports (id, region, cases) VALUES ($1, $2, $3)`, rep.ID, rep.Region, rep.Cases); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+tables+`_totals (region, cases) VALUES ($1, $2)
		ON CONFLICT (region) DO UPDATE SET cases = `+tables+`_totals.cases + EXCLUDED.cases`, rep.Region, rep.Cases)
	return err
}

// postgresPipeline runs the source into an input topic, then the pattern's
// consumer through the lab's faults, and reads the rows back. progress,
// when given, reports stored offsets (the total is taken from Kafka); when
// nil, the group's Kafka offsets are used. setup, when given, prepares
// pattern tables named after the run.
func (l *Lab) postgresPipeline(ctx context.Context, p Pattern, policy sourcePolicy, stamp bool,
	start func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func()) error,
	progress func(ctx context.Context, name, in string) (int64, int64, error),
	setup ...func(ctx context.Context, tables string) error,
) (result, error) {
	adm, closeAdm, err := l.admin()
	if err != nil {
		return result{}, err
	}
	defer closeAdm()
	name := runName(p)
	in := name + "-in"
	if err := l.newTopics(ctx, adm, in); err != nil {
		return result{}, err
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), in) }()
	tables := fmt.Sprintf("eoslab_%d", time.Now().UnixNano())
	if _, err := l.Pool.Exec(ctx, `CREATE TABLE `+tables+`_reports (seq bigserial PRIMARY KEY, id text NOT NULL, region text NOT NULL, cases integer NOT NULL);
		CREATE TABLE `+tables+`_totals (region text PRIMARY KEY, cases bigint NOT NULL)`); err != nil {
		return result{}, err
	}
	defer func() {
		_, _ = l.Pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+tables+`_reports, `+tables+`_totals, `+tables+`_ids`)
	}()
	for _, s := range setup {
		if err := s(ctx, tables); err != nil {
			return result{}, err
		}
	}

	feed := func(ctx context.Context, from, to int) error {
		l.progress(p, fmt.Sprintf("source: writing reports %d to %d", from, to))
		return source(ctx, l.Brokers, in, l.Reports[from:to], from, l.LostEvery, policy, eos.ExactlyOnce, stamp)
	}
	kafkaProgress := groupProgress(adm, name, in)
	prog := kafkaProgress
	if progress != nil {
		prog = func(ctx context.Context) (int64, int64, error) {
			_, total, err := kafkaProgress(ctx)
			if err != nil {
				return 0, 0, err
			}
			done, _, err := progress(ctx, name, in)
			return done, total, err
		}
	}
	faults, err := l.churn(ctx, p, func(ctx context.Context, _ string, clientOpts []kgo.Opt, wait func()) error {
		return start(ctx, name, in, tables, clientOpts, wait)
	}, feed, prog, describeGroup(adm, name))
	if err != nil {
		return result{}, err
	}

	res := result{faults: faults, totals: map[string]int{}}
	rows, err := l.Pool.Query(ctx, `SELECT seq, id, region, cases FROM `+tables+`_reports ORDER BY seq`)
	if err != nil {
		return result{}, err
	}
	var rep Report
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&seq, &rep.ID, &rep.Region, &rep.Cases}, func() error {
		res.outputs = append(res.outputs, outputOf(rep, verify.Position{Topic: tables + "_reports", Offset: seq}))
		return nil
	}); err != nil {
		return result{}, err
	}
	totals, err := l.Pool.Query(ctx, `SELECT region, cases FROM `+tables+`_totals`)
	if err != nil {
		return result{}, err
	}
	var region string
	var cases int
	if _, err := pgx.ForEachRow(totals, []any{&region, &cases}, func() error {
		res.totals[region] = cases
		return nil
	}); err != nil {
		return result{}, err
	}
	return res, nil
}
