package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

// nextFunc returns the next database transaction to publish, or nil once
// until passes.
type nextFunc func(until time.Time) (*dbTxn, error)

// deleteFunc deletes a batch's rows before its commit, and returns the
// published rows still to delete, for its position record to carry.
type deleteFunc func(context.Context, *pending) ([]carriedTxn, error)

// published is where a relay's position in Kafka stands: the end of the
// last database transaction published, and that transaction's id and
// commit time (0 when the position does not say).
type published struct {
	end       pglogrepl.LSN
	xid       uint32
	committed int64 // its commit time, microseconds since 1970 (0: unknown)
}

// publisher is how a relay's batches reach Kafka: in a Kafka transaction
// with the position (exactly-once), or acknowledged and then confirmed to
// the slot (at-least-once).
type publisher interface {
	// start returns what is already published: the position committed
	// in Kafka (its end, and the transaction id that ends there, 0 when
	// unknown), or 0 (the slot's own position says), and the published
	// rows that position names as not deleted yet.
	start(ctx context.Context) (published, map[int64]uint32, error)
	// publish produces b's records (b is read whole: see collect),
	// deletes its rows with del (which returns the published rows it
	// could not delete yet), and commits.
	publish(ctx context.Context, b *pending, del deleteFunc) error
	// probe produces recs in a Kafka transaction it aborts, in chunks
	// of chunk records, each waited for, until one fails (its
	// *eos.ProduceError) or budget passes; it returns how many passed.
	// errNoProbe: this publisher can not (its records would be seen).
	probe(ctx context.Context, recs []*kgo.Record, chunk int, budget time.Duration) (passed int, err error)
	close()
}

// errNoProbe: the publisher can not produce records nobody sees.
var errNoProbe = errors.New("outbox: this publisher can not probe records")

// errProbed ends a probe's Kafka transaction, which is then aborted.
var errProbed = errors.New("outbox: probed")

func (c *config) newPublisher() (publisher, error) {
	clientOpts := append(append([]kgo.Opt(nil), c.clientOpts...), kgo.RecordPartitioner(partitioner()))
	if c.semantics == eos.AtLeastOnce {
		p, err := eos.NewIdempotentProducer(eos.Brokers(c.brokers...), eos.Logger(c.logger), eos.ClientOptions(clientOpts...))
		if err != nil {
			return nil, err
		}
		return &ackPublisher{cfg: c, p: p}, nil
	}
	p, err := eos.NewTransactionalProducer(eos.Brokers(c.brokers...), eos.TransactionalID(c.txnID), eos.Logger(c.logger), eos.ClientOptions(clientOpts...))
	if err != nil {
		return nil, err
	}
	return &txnPublisher{cfg: c, p: p, conn: c.connOpts()}, nil
}

// connOpts are the options of the relay's own short-lived clients (reading
// the position, looking up topics): the pass-through options, then the
// seed brokers.
func (c *config) connOpts() []kgo.Opt {
	return append(append([]kgo.Opt(nil), c.clientOpts...), kgo.SeedBrokers(c.brokers...))
}

// collect extends b from next until it holds maxRecords or the commit
// interval passed. It runs before the batch's Kafka transaction begins:
// reading a large database transaction from the slot takes its time, and
// that time must not count against the Kafka transaction's timeout.
func (c *config) collect(b *pending, next nextFunc) error {
	n := 0
	for _, t := range b.txns {
		n += len(t.rows)
	}
	closeAt := time.Now().Add(c.commitInterval)
	for n < c.maxRecords {
		t, err := next(closeAt)
		if err != nil || t == nil {
			return err
		}
		b.txns = append(b.txns, t)
		n += len(t.rows)
	}
	return nil
}

// produceAll produces b's records with produce, refusing those addressed
// as a relay's position. produce returns an error only when b.oneByOne
// asks it to wait for each record.
func (c *config) produceAll(b *pending, produce func(*kgo.Record) error) error {
	for _, t := range b.txns {
		for _, rw := range t.rows {
			if err := c.refusePosition(rw, b.dead); err != nil {
				return err
			}
			if err := produce(c.record(rw, b.dead)); err != nil {
				return err
			}
		}
	}
	return nil
}

// refusePosition refuses rw when it is addressed as a relay's position:
// to this relay's position topic, or keyed "<system id>/<anything>" as a
// position record of this database is. Such a record is dead-lettered
// (dead) when the relay has a dead-letter topic, and otherwise stops it
// with a *RecordError wrapping ErrPositionRecord.
func (c *config) refusePosition(rw row, dead map[int64]error) error {
	if _, already := dead[rw.id]; already {
		return nil
	}
	system, _, _ := strings.Cut(c.key, "/")
	switch {
	case c.positionTopic != "" && rw.rec.Topic == c.positionTopic:
	case system != "" && strings.HasPrefix(string(rw.rec.Key), system+"/"):
	default:
		return nil
	}
	cause := fmt.Errorf("%w: topic %q, key of %d bytes", ErrPositionRecord, rw.rec.Topic, len(rw.rec.Key))
	if c.deadLetter == "" {
		return finalError{&RecordError{ID: rw.id, Topic: rw.rec.Topic, Partition: rw.partition, Err: cause}}
	}
	c.logger.Warn("outbox: record addressed as a relay's position; dead-lettering it", "id", rw.id, "topic", rw.rec.Topic, "dead_letter_topic", c.deadLetter)
	dead[rw.id] = cause
	return nil
}

type txnPublisher struct {
	cfg  *config
	p    *eos.TransactionalProducer
	conn []kgo.Opt
}

// start registers the transactional id, which fences any other relay
// with it and aborts its open transaction, and only then reads the
// position: what it reads can no longer change behind it.
func (t *txnPublisher) start(ctx context.Context) (published, map[int64]uint32, error) {
	if _, _, err := t.p.ProducerID(ctx); err != nil {
		return published{}, nil, err
	}
	pos, err := readPosition(ctx, t.conn, t.cfg.positionTopic, t.cfg.key, t.cfg.markerWait)
	if err != nil {
		return published{}, nil, err
	}
	if pos.lsn == 0 || pos.Token == t.cfg.token {
		undeleted := map[int64]uint32{}
		decodeCarried(pos.Undeleted, undeleted)
		return published{end: pos.lsn, xid: pos.Xid, committed: pos.Committed}, undeleted, nil
	}
	t.cfg.logger.Warn("outbox: the position in Kafka belongs to an earlier slot of this name (re-created since); starting from the slot's own",
		"slot", t.cfg.slot, "position", pos.lsn.String())
	return published{}, nil, nil
}

func (t *txnPublisher) publish(ctx context.Context, b *pending, del deleteFunc) error {
	return t.p.Transact(ctx, func(tx *eos.Tx) error {
		produce := func(r *kgo.Record) error {
			if b.oneByOne {
				return tx.ProduceSync(r)
			}
			tx.Produce(r)
			return nil
		}
		if err := t.cfg.produceAll(b, produce); err != nil {
			return err
		}
		// The rows' deletion overlaps the wait for Kafka's
		// acknowledgements of the records; the position record follows
		// it, naming the rows it could not delete yet, and the commit
		// waits for every record.
		undeleted, err := del(ctx, b)
		if err != nil {
			return err
		}
		if err := tx.ProduceSync(positionRecord(t.cfg.positionTopic, t.cfg.key, t.cfg.token, b.txns[len(b.txns)-1], undeleted)); err != nil {
			return err
		}
		if t.cfg.hooks.beforeCommit != nil {
			t.cfg.hooks.beforeCommit()
		}
		return nil
	})
}

func (t *txnPublisher) probe(ctx context.Context, recs []*kgo.Record, chunk int, budget time.Duration) (passed int, err error) {
	began := time.Now()
	err = t.p.Transact(ctx, func(tx *eos.Tx) error {
		for passed < len(recs) && time.Since(began) < budget {
			k := min(chunk, len(recs)-passed)
			if err := tx.ProduceSync(recs[passed : passed+k]...); err != nil {
				return err
			}
			passed += k
		}
		return errProbed
	})
	if errors.Is(err, errProbed) {
		return passed, nil
	}
	return passed, err
}

func (t *txnPublisher) close() { t.p.Close() }

type ackPublisher struct {
	cfg *config
	p   *eos.IdempotentProducer
}

func (a *ackPublisher) start(context.Context) (published, map[int64]uint32, error) {
	return published{}, nil, nil
}
func (a *ackPublisher) fences() bool { return false }

// publish: without a position record, the rows it could not delete yet
// are remembered by this relay only.
func (a *ackPublisher) publish(ctx context.Context, b *pending, del deleteFunc) error {
	var mu sync.Mutex
	var first error
	produce := func(r *kgo.Record) error {
		a.p.ProduceAsync(ctx, r, func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = &eos.ProduceError{Topic: r.Topic, Partition: r.Partition, Err: err, Record: r}
			}
		})
		if !b.oneByOne {
			return nil
		}
		if err := a.p.Flush(ctx); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	err := a.cfg.produceAll(b, produce)
	if ferr := a.p.Flush(ctx); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	mu.Lock()
	err = first
	mu.Unlock()
	if err != nil {
		return err
	}
	if _, err := del(ctx, b); err != nil {
		return err
	}
	if a.cfg.hooks.beforeCommit != nil {
		a.cfg.hooks.beforeCommit()
	}
	return nil
}

func (a *ackPublisher) probe(context.Context, []*kgo.Record, int, time.Duration) (int, error) {
	return 0, errNoProbe
}

func (a *ackPublisher) close() { a.p.Close() }
