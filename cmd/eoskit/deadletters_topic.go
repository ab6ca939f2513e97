package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/txnscan"
	"github.com/eoskit/eoskit/verify"
)

// topicLetters is a Kafka dead-letter topic as eos's DeadLetter policy
// writes it (each record as it came, with eoskit-error and
// eoskit-source-{topic,partition,offset} headers) or an outbox relay's
// DeadLetter topic (eoskit-outbox-{id,topic,error} headers, and
// eoskit-outbox-value when the value was too large for Kafka and is kept
// only in the outbox's dead-letter table).
type topicLetters struct {
	opts    []kgo.Opt
	brokers []string
	topic   string
	group   string // the replaying group
	logger  *slog.Logger
}

// topicLetter is one record of a dead-letter topic.
type topicLetter struct {
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	Source     string `json:"source"` // where it was read (eos) or the topic it was for (outbox)
	Error      string `json:"error"`
	KeyBytes   int    `json:"key_bytes"`
	ValueBytes int    `json:"value_bytes"`
	Replayed   bool   `json:"replayed"` // the replaying group's offsets are past it
}

// fromOutbox reports whether r is an outbox relay's dead letter: the
// relay writes eoskit-outbox-id first, before any header of the record.
func fromOutbox(r *kgo.Record) bool {
	return len(r.Headers) > 0 && r.Headers[0].Key == loop.HeaderOutboxID
}

// header returns the dead-letter header key of r as eoskit wrote it, and
// none of the other kind's (an outbox letter's eoskit-source-* headers
// are its record's own). A dead letter written before eoskit dropped its
// input's own dead-letter headers may hold two: eos appended its own
// after the input's (the last is eoskit's); the relay put its id, topic
// and error before the record's (the first are) and its value header
// after them (the last is).
func header(r *kgo.Record, key string) (string, bool) {
	outbox := fromOutbox(r)
	if outbox != strings.HasPrefix(key, "eoskit-outbox-") {
		return "", false
	}
	last := !outbox || key == loop.HeaderOutboxValue
	v, found := "", false
	for _, h := range r.Headers {
		if h.Key == key {
			v, found = string(h.Value), true
			if !last {
				break
			}
		}
	}
	return v, found
}

// letterOf describes r for a listing.
func letterOf(r *kgo.Record) topicLetter {
	l := topicLetter{Partition: r.Partition, Offset: r.Offset, KeyBytes: len(r.Key), ValueBytes: len(r.Value)}
	if fromOutbox(r) {
		topic, _ := header(r, "eoskit-outbox-topic")
		id, _ := header(r, "eoskit-outbox-id")
		l.Source = fmt.Sprintf("%s (outbox row %s)", topic, id)
		l.Error, _ = header(r, "eoskit-outbox-error")
		return l
	}
	topic, _ := header(r, "eoskit-source-topic")
	p, _ := header(r, "eoskit-source-partition")
	o, _ := header(r, "eoskit-source-offset")
	l.Source = fmt.Sprintf("%s[%s]@%s", topic, p, o)
	l.Error, _ = header(r, "eoskit-error")
	return l
}

// replayRecord is what replaying r sends: its key, value and own headers
// (the dead-letter headers dropped, an eoskit-replayed-from added), to
// toTopic or else to the topic it was read from (eos) or meant for
// (outbox). A record whose value the outbox left out (too large for
// Kafka) or that names no topic is refused: sending it would publish
// something else than the record.
func replayRecord(r *kgo.Record, toTopic string) (*kgo.Record, error) {
	at := fmt.Sprintf("%s[%d]@%d", r.Topic, r.Partition, r.Offset)
	// The relay leaves the value out only with this header; a value
	// present says the header is the record's own (an earlier eoskit
	// kept it).
	if table, ok := header(r, loop.HeaderOutboxValue); ok && r.Value == nil {
		id, _ := header(r, loop.HeaderOutboxID)
		return nil, fmt.Errorf("%w: dead letter %s holds no value (%s): once the topic takes the record (max.message.bytes), replay it from that table: eoskit dead-letters replay -outbox-dead-letters -id %s", errKeptInTable, at, table, shown(id))
	}
	source, ok := header(r, "eoskit-source-topic")
	if !ok {
		source, _ = header(r, "eoskit-outbox-topic")
	}
	to := cmp.Or(toTopic, source)
	if to == "" {
		return nil, fmt.Errorf("dead letter %s names no topic (no eoskit-source-topic or eoskit-outbox-topic header): name -to-topic", at)
	}
	headers := append(loop.WithoutDeadLetterHeaders(r.Headers), kgo.RecordHeader{Key: deadletter.ReplayedFromHeader, Value: []byte(at)})
	return &kgo.Record{Topic: to, Key: r.Key, Value: r.Value, Headers: headers}, nil
}

// each hands fn the topic's committed records up to its last stable
// offset, one fetch held at a time, until fn returns false.
func (t topicLetters) each(ctx context.Context, fn func(*kgo.Record) bool) error {
	return verify.EachRecord(ctx, t.opts, t.topic, kgo.ReadCommitted(), false, false, time.Until(deadline(ctx)), fn)
}

func (t topicLetters) admin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(t.opts...)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

func (t topicLetters) committed(ctx context.Context) (kadm.OffsetResponses, error) {
	adm, closeAdm, err := t.admin()
	if err != nil {
		return nil, err
	}
	defer closeAdm()
	committed, err := adm.FetchOffsets(ctx, t.group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("read the offsets of group %s: %w", t.group, err)
	}
	return committed, nil
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Minute)
}

func replayed(committed kadm.OffsetResponses, r *kgo.Record) bool {
	o, ok := committed.Lookup(r.Topic, r.Partition)
	return ok && o.At > r.Offset
}

func (t topicLetters) list(ctx context.Context, limit int) ([]topicLetter, error) {
	committed, err := t.committed(ctx)
	if err != nil {
		return nil, err
	}
	var out []topicLetter
	err = t.each(ctx, func(r *kgo.Record) bool {
		l := letterOf(r)
		l.Replayed = replayed(committed, r)
		out = append(out, l)
		return len(out) < limit
	})
	return out, err
}

// replay copies the topic's records that the replaying group has not
// committed yet, at least up to what the topic held when it started, with
// an eos processor: each copy commits with the group's offset past its
// record. It returns how many of the records it read at the start were
// copied (the group's offsets moved past them), also when it fails.
func (t topicLetters) replay(ctx context.Context, toTopic string) (replayedN, passedBy int, err error) {
	if err := t.refuseLiveGroup(ctx); err != nil {
		return 0, 0, err
	}
	before, err := t.committed(ctx)
	if err != nil {
		return 0, 0, err
	}
	// The offset past each partition's last record: the group is done once
	// its committed offsets reach them (markers follow, and are never
	// consumed). Only the records' positions are kept, not the records.
	targets := map[int32]int64{}
	var recs []*kgo.Record
	if err := t.each(ctx, func(r *kgo.Record) bool {
		targets[r.Partition] = r.Offset + 1
		recs = append(recs, &kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset})
		return true
	}); err != nil {
		return 0, 0, err
	}
	if done(before, t.topic, targets) {
		return 0, 0, nil
	}
	// passed: the dead letters passed by (errKeptInTable), by position:
	// a transaction that aborts hands them over again.
	var mu sync.Mutex
	passed := map[string]bool{}
	passedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(passed)
	}
	copied := func() int {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		after, err := t.committed(cctx)
		if err != nil {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range recs {
			if !replayed(before, r) && replayed(after, r) && !passed[position(r)] {
				n++
			}
		}
		return n
	}
	txnID, err := eos.StableTransactionalID(t.group, "replay")
	if err != nil {
		return 0, 0, err
	}
	p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		out, err := replayRecord(r, toTopic)
		if errors.Is(err, errKeptInTable) {
			mu.Lock()
			defer mu.Unlock()
			if at := position(r); !passed[at] {
				passed[at] = true
				t.logger.Warn("eoskit: passing by a dead letter replay cannot copy", "err", err)
			}
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return []*kgo.Record{out}, nil
	}, eos.Brokers(t.brokers...), eos.Group(t.group), eos.Topics(t.topic), eos.TransactionalID(txnID),
		eos.Logger(t.logger), eos.ClientOptions(t.opts...))
	if err != nil {
		return 0, 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()

	adm, closeAdm, err := t.admin()
	if err != nil {
		return 0, 0, err
	}
	defer closeAdm()
	for {
		select {
		case err := <-ran:
			return copied(), passedCount(), fmt.Errorf("the replaying processor stopped before it was done: %w", cmp.Or(err, errors.New("it returned early")))
		case <-ctx.Done():
			stop()
			<-ran
			return copied(), passedCount(), fmt.Errorf("not done within -timeout (group %s has not committed past the topic's last records): %w", t.group, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		if committed, err := adm.FetchOffsets(ctx, t.group); err == nil && done(committed, t.topic, targets) {
			stop()
			err := <-ran
			return copied(), passedCount(), err
		}
	}
}

// position names a record by partition and offset.
func position(r *kgo.Record) string { return fmt.Sprintf("%d@%d", r.Partition, r.Offset) }

// errKeptInTable is a dead letter an outbox relay kept no value of (too
// large for Kafka): its record lives in the outbox's dead-letter table.
// The replay passes it by, saying so, rather than stop for good on a
// record no replay can copy.
var errKeptInTable = errors.New("kept in the outbox's dead-letter table")

// refuseLiveGroup refuses a replaying group with members: it would be an
// application's group (the one that dead-lettered, say), whose
// transactional ids and offsets a replay must not take over.
func (t topicLetters) refuseLiveGroup(ctx context.Context) error {
	adm, closeAdm, err := t.admin()
	if err != nil {
		return err
	}
	defer closeAdm()
	described, err := adm.DescribeGroups(ctx, t.group)
	if err != nil {
		return fmt.Errorf("describe group %s: %w", t.group, err)
	}
	var ids []string
	for _, m := range described[t.group].Members {
		ids = append(ids, m.ClientID)
	}
	// A group of Kafka's consumer protocol (KIP-848) is no classic group:
	// DescribeGroups shows it without members.
	if consumer, err := adm.DescribeConsumerGroups(ctx, t.group); err == nil {
		for _, m := range consumer[t.group].Members {
			ids = append(ids, m.ClientID)
		}
	} else if !errors.Is(err, kerr.UnsupportedVersion) && !txnscan.IsUnsupportedError(err) {
		return fmt.Errorf("describe consumer group %s: %w", t.group, err)
	}
	if len(ids) > 0 {
		return fmt.Errorf("group %s has %d live members (%s): a replay runs in a group of its own (-replay-group)", t.group, len(ids), strings.Join(ids, ", "))
	}
	return nil
}

// done reports whether the group's committed offsets reach targets.
func done(committed kadm.OffsetResponses, topic string, targets map[int32]int64) bool {
	for p, target := range targets {
		if o, ok := committed.Lookup(topic, p); !ok || o.At < target {
			return false
		}
	}
	return true
}
