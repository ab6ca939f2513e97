package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/eoskit/eoskit/verify"
	"github.com/twmb/franz-go/pkg/kgo"
)

// rawCopy is the copier of the KAFKA-20734 reproduction: a plain franz-go
// GroupTransactSession loop, shaped like franz-go's own TestTxnEtl and
// Kafka's TransactionalMessageCopier (read_committed, at most 750 records
// per transaction, the offsets committed inside it), with no eoskit code, so
// that whatever it loses or duplicates is the broker's doing. A session
// that fails is closed and started again a second later, as a supervisor
// would.
func rawCopy(ctx context.Context, brokers []string, group, in, out, txnID string, logger *slog.Logger, clientOpts []kgo.Opt) error {
	opts := append(clientOpts, kgo.SeedBrokers(brokers...), kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(30*time.Second), kgo.ConsumerGroup(group), kgo.ConsumeTopics(in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	for ctx.Err() == nil {
		err := rawSession(ctx, opts, out)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		logger.Warn("copier: raw session failed; starting another", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

func rawSession(ctx context.Context, opts []kgo.Opt, out string) error {
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return err
	}
	defer sess.Close()
	for {
		fetches := sess.PollRecords(ctx, 750)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			fetchErr = errors.Join(fetchErr, fmt.Errorf("fetch %s[%d]: %w", t, p, err))
		})
		if fetchErr != nil {
			return fetchErr
		}
		if fetches.Empty() {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		e := kgo.AbortingFirstErrPromise(sess.Client())
		fetches.EachRecord(func(r *kgo.Record) {
			sess.Produce(ctx, &kgo.Record{Topic: out, Key: r.Key, Value: verify.CopyValue(r)}, e.Promise())
		})
		// A rebalance makes End abort and answer (false, nil): the
		// records are polled again.
		if _, err := sess.End(ctx, kgo.TransactionEndTry(e.Err() == nil)); err != nil {
			return fmt.Errorf("end: %w", err)
		}
	}
}
