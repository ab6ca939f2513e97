package eoslab

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/dedupconsumer"
	"github.com/eoskit/eoskit/patterns/kafkatopostgres"
	"github.com/eoskit/eoskit/verify"
)

// The database rows run the patterns kafkatopostgres and dedupconsumer on
// tables of their own, each report a row of <tables>_reports (no unique
// key: a duplicate is a second row) added to its region's total.

// labMaxPoll is the batch size of both database rows; with DrainTimeout(0),
// the lab's stop acts as a crash (see kafkaPipeline).
const labMaxPoll = 200

func exactlyOncePostgres() Pattern {
	return Pattern{
		Name:          "exactly-once kafka→postgres",
		Guarantee:     "offsetstore: rows and offsets in one database transaction",
		NeedsDatabase: true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			cfg := func(name, in, tables string) kafkatopostgres.Config {
				return kafkatopostgres.Config{Pool: l.Pool, Brokers: l.Brokers, Group: name, Topic: in, Tables: tables,
					Logger: l.Logger.With("pattern", p.Name)}
			}
			return l.postgresPipeline(ctx, p, resume, false,
				func(ctx context.Context, name, in, tables string) error {
					return kafkatopostgres.Migrate(ctx, cfg(name, in, tables))
				},
				func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func(processor string)) error {
					c := cfg(name, in, tables)
					handle := kafkatopostgres.Handle(tables)
					// The pattern's handler, a record at a time, so that the
					// faults can catch it mid-batch.
					c.Handler = func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
						for _, rec := range recs {
							wait("")
							if err := handle(ctx, tx, []*kgo.Record{rec}); err != nil {
								return err
							}
						}
						return nil
					}
					c.Options = []offsetstore.Option{offsetstore.MaxRecordsPerCommit(labMaxPoll),
						offsetstore.ClientOptions(clientOpts...), offsetstore.DrainTimeout(0)}
					return kafkatopostgres.Run(ctx, c)
				},
				func(ctx context.Context, name, _ string) (int64, int64, error) {
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
			cfg := func(name, in, tables string) dedupconsumer.Config {
				return dedupconsumer.Config{Pool: l.Pool, Brokers: l.Brokers, Group: name, Topic: in, Tables: tables,
					Logger: l.Logger.With("pattern", p.Name)}
			}
			return l.postgresPipeline(ctx, p, resend, true,
				func(ctx context.Context, name, in, tables string) error {
					return dedupconsumer.Migrate(ctx, cfg(name, in, tables))
				},
				func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func(processor string)) error {
					c := cfg(name, in, tables)
					handle := dedupconsumer.Handle(tables)
					c.Handler = func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
						wait("")
						return handle(ctx, tx, rec)
					}
					c.Options = []dedup.Option{dedup.MaxRecordsPerCommit(labMaxPoll),
						dedup.ClientOptions(clientOpts...), dedup.DrainTimeout(0)}
					return dedupconsumer.Run(ctx, c)
				}, nil)
		},
	}
}

// postgresPipeline runs the source into an input topic, migrates the
// pattern's tables (named after the run), runs the pattern's consumer
// through the lab's faults, and reads the rows back. progress, when given,
// reports stored offsets (the total is taken from Kafka); when nil, the
// group's Kafka offsets are used.
func (l *Lab) postgresPipeline(ctx context.Context, p Pattern, policy sourcePolicy, stamp bool,
	migrate func(ctx context.Context, name, in, tables string) error,
	start func(ctx context.Context, name, in, tables string, clientOpts []kgo.Opt, wait func(processor string)) error,
	progress func(ctx context.Context, name, in string) (int64, int64, error),
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
	defer func() {
		_, _ = l.Pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+tables+`_reports, `+tables+`_totals, `+tables+`_ids`)
	}()
	if err := migrate(ctx, name, in, tables); err != nil {
		return result{}, err
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
	faults, err := l.churn(ctx, p, func(ctx context.Context, _ string, clientOpts []kgo.Opt, wait func(processor string)) error {
		return start(ctx, name, in, tables, clientOpts, wait)
	}, feed, prog, describeGroup(adm, name, in), nil)
	if err != nil {
		return result{}, err
	}

	res := result{faults: faults}
	rows, err := l.Pool.Query(ctx, `SELECT seq, id, region, cases FROM `+tables+`_reports ORDER BY seq`)
	if err != nil {
		return result{}, err
	}
	var rep dashboard.Report
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&seq, &rep.ID, &rep.Region, &rep.Cases}, func() error {
		res.outputs = append(res.outputs, outputOf(rep, verify.Position{Topic: tables + "_reports", Offset: seq}))
		return nil
	}); err != nil {
		return result{}, err
	}
	if res.totals, err = dashboard.Totals(ctx, l.Pool, tables); err != nil {
		return result{}, err
	}
	return res, nil
}
