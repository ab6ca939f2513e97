package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/verify"
)

// runDeadLetters runs `eoskit dead-letters list|replay FLAGS`; args start
// at the verb.
func runDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 || args[0] != "list" && args[0] != "replay" {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet("eoskit dead-letters "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	kf := addKafkaFlags(fs)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL holding "+deadletter.Table+" (default $DATABASE_URL)")
	dlq := fs.String("dead-letter-topic", "", "a Kafka dead-letter topic instead of the PostgreSQL table")
	group := fs.String("group", "", "table: only records this group parked; topic: the replaying group (default eoskit-replay-TOPIC)")
	topic := fs.String("topic", "", "only records read from this topic")
	var ids idList
	fs.Var(&ids, "id", "table: only this row id (repeatable)")
	limit := fs.Int("limit", 100, "list: at most this many")
	toTopic := fs.String("to-topic", "", "replay: send every record to this topic rather than the one it was read from")
	outboxName := fs.String("outbox", "", "replay from the table: the outbox to write to, as outbox.Name gives it (default: the database's default outbox)")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	switch {
	case *dlq != "" && len(ids) > 0:
		fmt.Fprintln(stderr, "-id picks rows of the table; a dead-letter topic has none")
		return exitUsage
	case *dlq == "" && *dbURL == "":
		fmt.Fprintln(stderr, "name the dead letters: -database-url (or $DATABASE_URL) for the table, or -dead-letter-topic")
		return exitUsage
	case *dlq != "" && *outboxName != "":
		fmt.Fprintln(stderr, "-outbox names where the table's records are replayed to; a dead-letter topic is replayed by a processor")
		return exitUsage
	case *limit <= 0:
		fmt.Fprintln(stderr, "-limit must be positive")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *kf.timeout)
	defer cancel()
	var o output = textOutput{stdout}
	if *kf.json {
		o = jsonOutput{stdout}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *dlq != "" {
		opts, err := kf.clientOpts()
		if err != nil {
			fmt.Fprintln(stderr, "eoskit:", err)
			return exitUsage
		}
		t := topicLetters{opts: opts, brokers: kf.seeds(), topic: *dlq, group: cmp.Or(*group, "eoskit-replay-"+*dlq), from: *topic, logger: logger}
		if verb == "list" {
			letters, err := t.list(ctx, *limit)
			if err != nil {
				fmt.Fprintf(stderr, "eoskit: list %s: %v\n", *dlq, err)
				return exitError
			}
			o.topicLetters(letters)
			return exitOK
		}
		n, err := t.replay(ctx, *toTopic)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: replay %s (%d replayed): %v\n", *dlq, n, err)
			return exitError
		}
		o.replayed(n, "group "+t.group+" committed them with their copies")
		return exitOK
	}

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	defer pool.Close()
	f := deadletter.Filter{Group: *group, Topic: *topic, IDs: ids}
	if verb == "list" {
		rows, err := deadletter.List(ctx, pool, f, *limit)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: %v\n", err)
			return exitError
		}
		o.tableLetters(rows)
		return exitOK
	}
	var w *outbox.Writer
	if *outboxName == "" {
		w, err = outbox.NewWriter()
	} else {
		w, err = outbox.NewWriter(outbox.Name(*outboxName))
	}
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	if relays, err := connectedRelays(ctx, pool); err == nil && relays == 0 {
		logger.Warn("eoskit: no outbox relay is connected to this database: the replayed records wait in the outbox until one runs")
	}
	n, err := deadletter.Replay(ctx, pool, f, *toTopic, w.Write)
	if err != nil {
		fmt.Fprintf(stderr, "eoskit: %v\n", err)
		return exitError
	}
	o.replayed(n, "the outbox's relay publishes them")
	return exitOK
}

// connectedRelays counts the logical replication connections to pool's
// database that decode with pgoutput, as an outbox relay does.
func connectedRelays(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots
		WHERE database = current_database() AND plugin = 'pgoutput' AND active`).Scan(&n)
	return n, err
}

// topicLetters is a Kafka dead-letter topic, as eos's and outbox's
// DeadLetter policies write it: each record as it came, with
// eoskit-error and eoskit-source-{topic,partition,offset} headers.
type topicLetters struct {
	opts    []kgo.Opt
	brokers []string
	topic   string
	group   string // the replaying group
	from    string // only records read from this topic
	logger  *slog.Logger
}

// topicLetter is one record of a dead-letter topic.
type topicLetter struct {
	Partition  int32  `json:"partition"`
	Offset     int64  `json:"offset"`
	Source     string `json:"source"` // topic[partition]@offset it was read from
	Error      string `json:"error"`
	KeyBytes   int    `json:"key_bytes"`
	ValueBytes int    `json:"value_bytes"`
	Replayed   bool   `json:"replayed"` // the replaying group's offsets are past it
}

const (
	sourceTopicHeader = "eoskit-source-topic"
	errorHeader       = "eoskit-error"
)

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// read returns the topic's committed records up to its last stable offset,
// and the replaying group's committed offsets.
func (t topicLetters) read(ctx context.Context) ([]*kgo.Record, kadm.OffsetResponses, error) {
	recs, err := verify.ReadTopicWith(ctx, t.opts, t.topic, kgo.ReadCommitted(), false, false, time.Until(deadline(ctx)))
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(t.opts...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	committed, err := kadm.NewClient(cl).FetchOffsets(ctx, t.group)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the offsets of group %s: %w", t.group, err)
	}
	return recs, committed, nil
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
	recs, committed, err := t.read(ctx)
	if err != nil {
		return nil, err
	}
	var out []topicLetter
	for _, r := range recs {
		if t.from != "" && header(r, sourceTopicHeader) != t.from {
			continue
		}
		if len(out) == limit {
			break
		}
		out = append(out, topicLetter{Partition: r.Partition, Offset: r.Offset,
			Source: fmt.Sprintf("%s[%s]@%s", header(r, sourceTopicHeader), header(r, "eoskit-source-partition"), header(r, "eoskit-source-offset")),
			Error:  header(r, errorHeader), KeyBytes: len(r.Key), ValueBytes: len(r.Value), Replayed: replayed(committed, r)})
	}
	return out, nil
}

// replay copies the topic's records that the replaying group has not
// committed yet, up to what the topic held when it started, with an eos
// processor: each copy commits with the group's offset past its record.
// With t.from set, records read from other topics are skipped (their
// offsets commit all the same: a later replay does not see them again).
func (t topicLetters) replay(ctx context.Context, toTopic string) (int, error) {
	recs, committed, err := t.read(ctx)
	if err != nil {
		return 0, err
	}
	// The offset past each partition's last record: the group is done once
	// its committed offsets reach them (markers follow, and are never
	// consumed).
	targets := map[int32]int64{}
	n := 0
	for _, r := range recs {
		targets[r.Partition] = r.Offset + 1
		if !replayed(committed, r) && (t.from == "" || header(r, sourceTopicHeader) == t.from) {
			n++
		}
	}
	if done(committed, t.topic, targets) {
		return 0, nil
	}
	txnID, err := eos.StableTransactionalID(t.group, "0")
	if err != nil {
		return 0, err
	}
	p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		source := header(r, sourceTopicHeader)
		if t.from != "" && source != t.from {
			return nil, nil
		}
		to := cmp.Or(toTopic, source)
		if to == "" {
			return nil, fmt.Errorf("dead letter %s[%d]@%d has no %s header: name -to-topic", r.Topic, r.Partition, r.Offset, sourceTopicHeader)
		}
		headers := []kgo.RecordHeader{}
		for _, h := range r.Headers {
			switch h.Key {
			case errorHeader, sourceTopicHeader, "eoskit-source-partition", "eoskit-source-offset":
			default:
				headers = append(headers, h)
			}
		}
		headers = append(headers, kgo.RecordHeader{Key: deadletter.ReplayedFromHeader,
			Value: fmt.Appendf(nil, "%s[%d]@%d", r.Topic, r.Partition, r.Offset)})
		return []*kgo.Record{{Topic: to, Key: r.Key, Value: r.Value, Headers: headers}}, nil
	}, eos.Brokers(t.brokers...), eos.Group(t.group), eos.InputTopics(t.topic), eos.TransactionalID(txnID),
		eos.Logger(t.logger), eos.ClientOptions(t.opts...))
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()

	cl, err := kgo.NewClient(t.opts...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		select {
		case err := <-ran:
			return 0, fmt.Errorf("the replaying processor stopped before it was done: %w", errors.Join(err, errors.New("it returned early")))
		case <-ctx.Done():
			stop()
			<-ran
			return 0, fmt.Errorf("not done within -timeout (group %s has not committed past the topic's last records): %w", t.group, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		if committed, err := adm.FetchOffsets(ctx, t.group); err == nil && done(committed, t.topic, targets) {
			stop()
			if err := <-ran; err != nil {
				return n, err
			}
			return n, nil
		}
	}
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

func (o textOutput) tableLetters(rows []deadletter.Row) {
	if len(rows) == 0 {
		fmt.Fprintf(o.w, "no dead letters in %s\n", deadletter.Table)
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tREAD-FROM\tPARKED\tKEY-BYTES\tVALUE-BYTES\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s[%d]@%d\t%s\t%d\t%d\t%s\n", r.ID, r.Group, r.Topic, r.Partition, r.Offset,
			r.CreatedAt.UTC().Format(time.RFC3339), r.KeyBytes, r.ValueBytes, oneLine(r.Error))
	}
	tw.Flush()
}

func (o textOutput) topicLetters(ls []topicLetter) {
	if len(ls) == 0 {
		fmt.Fprintln(o.w, "no dead letters in the topic")
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tREAD-FROM\tREPLAYED\tKEY-BYTES\tVALUE-BYTES\tERROR")
	for _, l := range ls {
		fmt.Fprintf(tw, "[%d]@%d\t%s\t%t\t%d\t%d\t%s\n", l.Partition, l.Offset, l.Source, l.Replayed, l.KeyBytes, l.ValueBytes, oneLine(l.Error))
	}
	tw.Flush()
}

func (o textOutput) replayed(n int, how string) {
	fmt.Fprintf(o.w, "replayed %d dead letters (%s)\n", n, how)
}

// oneLine keeps an error's text on one line of the table, at most 200
// characters.
func oneLine(s string) string {
	s = strconv.Quote(s)
	s = s[1 : len(s)-1]
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func (o jsonOutput) tableLetters(rows []deadletter.Row) { o.print(nonNil(rows)) }
func (o jsonOutput) topicLetters(ls []topicLetter)      { o.print(nonNil(ls)) }
func (o jsonOutput) replayed(n int, _ string)           { o.print(map[string]int{"replayed": n}) }
