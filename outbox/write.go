package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Write stores records in the default outbox ([Table]) inside the
// caller's transaction tx: they reach Kafka if and only if tx commits,
// after every record of every database transaction that committed before
// it, and in the order given. Each record's Topic is required; Key, Value
// and Headers are kept as they are; Partition, Timestamp and the rest are
// ignored (records go where Kafka's default partitioner sends their key,
// so that one key keeps one partition; use [WriteToPartition] to choose).
// Its Timestamp in Kafka is the database transaction's commit time. An
// outbox with a [Name] is written with a [Writer].
func Write(ctx context.Context, tx pgx.Tx, records ...*kgo.Record) error {
	return write(ctx, tx, Table, nil, records)
}

// WriteToPartition is [Write] for records that must go to one partition
// of their topics. A partition the topic does not have is refused by the
// relay as the record's fault: with a [DeadLetter] topic the record is
// dead-lettered and the others publish; without one the relay stops with
// a *[RecordError] wrapping [ErrInvalidPartition]. The relay checks with
// a fresh metadata look-up first, so that a partition just added, which
// its producer may not know yet, is published there.
func WriteToPartition(ctx context.Context, tx pgx.Tx, partition int32, records ...*kgo.Record) error {
	return writeToPartition(ctx, tx, Table, partition, records)
}

// Writer writes records into one outbox, the one its [Name] names, inside
// the caller's transactions, as [Write] and [WriteToPartition] do into the
// default outbox; the relay with the same Name publishes them. It holds no
// connection: one Writer serves every goroutine. The zero Writer writes
// into the default outbox.
type Writer struct {
	table string // "": the default outbox's
}

// NewWriter returns a writer into the outbox its options name: [Name],
// or none for the default outbox. A malformed name is an
// *eoskit.ConfigError naming Name.
func NewWriter(opts ...WriterOption) (*Writer, error) {
	var n names
	for _, o := range opts {
		o.writerOption(&n)
	}
	if err := n.check(); err != nil {
		return nil, err
	}
	return &Writer{table: n.table()}, nil
}

// Write is [Write] into w's outbox.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, records ...*kgo.Record) error {
	return write(ctx, tx, w.tableName(), nil, records)
}

// WriteToPartition is [WriteToPartition] into w's outbox.
func (w *Writer) WriteToPartition(ctx context.Context, tx pgx.Tx, partition int32, records ...*kgo.Record) error {
	return writeToPartition(ctx, tx, w.tableName(), partition, records)
}

func (w *Writer) tableName() string {
	if w.table == "" {
		return Table
	}
	return w.table
}

func writeToPartition(ctx context.Context, tx pgx.Tx, table string, partition int32, records []*kgo.Record) error {
	if partition < 0 {
		return fmt.Errorf("outbox: write: partition %d is negative", partition)
	}
	return write(ctx, tx, table, &partition, records)
}

func write(ctx context.Context, tx pgx.Tx, table string, partition *int32, records []*kgo.Record) error {
	partitions := make([]*int32, len(records))
	for i := range partitions {
		partitions[i] = partition
	}
	return writeRows(ctx, tx, table, partitions, records)
}

// writeRows is write with each record's own partition (nil: by key).
func writeRows(ctx context.Context, tx pgx.Tx, table string, partitions []*int32, records []*kgo.Record) error {
	if len(records) == 0 {
		return nil
	}
	topics := make([]string, len(records))
	keys := make([][]byte, len(records))
	values := make([][]byte, len(records))
	headers := make([][]byte, len(records))
	for i, r := range records {
		if r == nil || r.Topic == "" {
			return fmt.Errorf("outbox: write: record %d has no topic", i)
		}
		topics[i], keys[i], values[i] = r.Topic, r.Key, r.Value
		headers[i] = encodeHeaders(r.Headers)
	}
	// One statement whatever the count; WITH ORDINALITY keeps the
	// records' order in their ids.
	_, err := tx.Exec(ctx, `INSERT INTO `+ident(table)+` (topic, partition, key, value, headers)
		SELECT t, p, k, v, h FROM unnest($1::text[], $2::integer[], $3::bytea[], $4::bytea[], $5::bytea[])
		WITH ORDINALITY AS r(t, p, k, v, h, n) ORDER BY n`,
		topics, partitions, keys, values, headers)
	if err != nil {
		return fmt.Errorf("outbox: write %d records to %s: %w", len(records), table, err)
	}
	return nil
}

// encodeHeaders packs headers as a count, then per header its key and
// value, each length-prefixed (uvarint); a nil value is length 0 and an
// empty one length 1, so both survive. No headers is NULL.
func encodeHeaders(hs []kgo.RecordHeader) []byte {
	if len(hs) == 0 {
		return nil
	}
	b := binary.AppendUvarint(nil, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		if h.Value == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(h.Value))+1)
		b = append(b, h.Value...)
	}
	return b
}

var errHeaders = errors.New("outbox: malformed headers column")

func decodeHeaders(b []byte) ([]kgo.RecordHeader, error) {
	if len(b) == 0 {
		return nil, nil
	}
	next := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errHeaders
		}
		b = b[n:]
		return v, nil
	}
	take := func(n uint64) ([]byte, error) {
		if n > uint64(len(b)) {
			return nil, errHeaders
		}
		out := b[:n:n]
		b = b[n:]
		return out, nil
	}
	count, err := next()
	if err != nil || count > uint64(len(b)) {
		return nil, errHeaders
	}
	hs := make([]kgo.RecordHeader, 0, count)
	for range count {
		kl, err := next()
		if err != nil {
			return nil, err
		}
		k, err := take(kl)
		if err != nil {
			return nil, err
		}
		vl, err := next()
		if err != nil {
			return nil, err
		}
		h := kgo.RecordHeader{Key: string(k)}
		if vl > 0 {
			if h.Value, err = take(vl - 1); err != nil {
				return nil, err
			}
		}
		hs = append(hs, h)
	}
	if len(b) != 0 {
		return nil, errHeaders
	}
	return hs, nil
}
