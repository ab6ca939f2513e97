package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/outbox"
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
	db := addDatabaseFlag(fs, "PostgreSQL holding "+deadletter.Table)
	dlq := fs.String("dead-letter-topic", "", "a Kafka dead-letter topic instead of the PostgreSQL table")
	group := fs.String("group", "", "table: only records this group parked")
	topic := fs.String("topic", "", "table: only records read from this topic")
	var ids idList
	fs.Var(&ids, "id", "table: only this row id (repeatable)")
	earlier := fs.Bool("earlier", false, "table, replay: also rows an earlier eoskit parked (their headers are lost, and a dedup row's id stays claimed: delete the claim by hand first)")
	limit := fs.Int("limit", 100, "list: at most this many")
	toTopic := fs.String("to-topic", "", "replay: send every record to this topic rather than the one it was read from")
	outboxName := fs.String("outbox", "", "table, replay: the outbox to write to, as outbox.Name gives it (default: the database's default outbox)")
	slot := fs.String("slot", "", "table, replay: the replication slot the outbox's relay reads, when it was given one (outbox.Slot); only to warn when no relay reads it (default: the outbox's default slot)")
	replayGroup := fs.String("replay-group", "", "topic: the group that replays, and whose offsets say what was replayed (default eoskit-replay-TOPIC); never an application's group")
	outboxLetters := fs.Bool("outbox-dead-letters", false, "the outbox's own dead-letter table (of -outbox, or the default outbox): the records its relay kept whole; replay moves them back into that outbox")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	switch {
	case *dlq != "" && (len(ids) > 0 || *group != "" || *topic != "" || *earlier || *outboxName != "" || *slot != ""):
		fmt.Fprintln(stderr, "-id, -group, -topic, -earlier, -outbox and -slot pick and replay rows of the table; a dead-letter topic is replayed whole, in a group of its own (-replay-group)")
		return exitUsage
	case *dlq == "" && *replayGroup != "":
		fmt.Fprintln(stderr, "-replay-group is for a dead-letter topic (-dead-letter-topic)")
		return exitUsage
	case *dlq != "" && *db.url != "":
		fmt.Fprintln(stderr, "-database-url names the table's dead letters; -dead-letter-topic a topic's: name one")
		return exitUsage
	case *limit <= 0:
		fmt.Fprintln(stderr, "-limit must be positive")
		return exitUsage
	case *outboxLetters && (*dlq != "" || *group != "" || *topic != "" || *earlier || *slot != ""):
		fmt.Fprintln(stderr, "-outbox-dead-letters reads the outbox's own table: -group, -topic, -earlier, -slot and -dead-letter-topic do not apply")
		return exitUsage
	case *outboxLetters && verb == "replay" && len(ids) == 0:
		// The relay sends every dead letter to its dead-letter topic too,
		// value and all unless too large: replaying both publishes twice.
		fmt.Fprintln(stderr, "replay -outbox-dead-letters replays the rows it is given (-id): the dead-letter topic holds the same records, with their values unless too large; replay each record from one of them")
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
		conn, err := kf.connect()
		if err != nil {
			fmt.Fprintln(stderr, "eoskit:", err)
			return exitUsage // settings missing, or given that cannot be honoured
		}
		if err := loop.ConnectError(ctx, "eoskit", conn.opts); err != nil {
			fmt.Fprintf(stderr, "eoskit: reach %s: %v\n", strings.Join(conn.seeds, ","), err)
			return exitError
		}
		t := topicLetters{opts: conn.opts, brokers: conn.seeds, topic: *dlq, group: cmp.Or(*replayGroup, "eoskit-replay-"+*dlq), logger: logger}
		if verb == "list" {
			letters, err := t.list(ctx, *limit)
			if err != nil {
				fmt.Fprintf(stderr, "eoskit: list %s: %v\n", *dlq, err)
				return exitError
			}
			o.topicLetters(letters)
			return exitOK
		}
		n, passed, err := t.replay(ctx, *toTopic)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: replay %s (%d replayed): %v\n", *dlq, n, err)
			return exitError
		}
		o.replayed(n, passed, "group "+t.group+" committed them with their copies")
		return exitOK
	}

	dbURL, code := db.connString(stderr, "name the dead letters: the table's database ($DATABASE_URL, -database-url, or libpq's PG* variables), or -dead-letter-topic")
	if code != exitOK {
		return code
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	defer pool.Close()
	if *outboxLetters {
		return outboxDeadLetters(ctx, pool, verb, *outboxName, ids, *limit, *toTopic, o, stderr)
	}
	f := deadletter.Filter{Group: *group, Topic: *topic, IDs: ids, Earlier: *earlier}
	if verb == "list" {
		rows, err := deadletter.List(ctx, pool, f, *limit)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: %v\n", err)
			return exitError
		}
		o.tableLetters(rows)
		return exitOK
	}
	var named []outbox.NameOption
	if *outboxName != "" {
		named = append(named, outbox.Name(*outboxName))
	}
	var writerOpts []outbox.WriterOption
	var slotOpts []outbox.MigrateOption
	for _, n := range named {
		writerOpts, slotOpts = append(writerOpts, n), append(slotOpts, n)
	}
	w, err := outbox.NewWriter(writerOpts...)
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	relaySlot := *slot
	if relaySlot == "" {
		relaySlot, _ = outbox.DefaultSlot(ctx, pool, slotOpts...)
	}
	if relaySlot != "" {
		if active, err := slotActive(ctx, pool, relaySlot); err == nil && !active {
			logger.Warn("eoskit: no outbox relay reads this slot: the replayed records wait in the outbox until one runs (a relay given outbox.Slot reads another: name it with -slot)", "slot", relaySlot)
		}
	}
	n, err := deadletter.Replay(ctx, pool, f, *toTopic, w.Write)
	if err != nil {
		fmt.Fprintf(stderr, "eoskit: %v\n", err)
		return exitError
	}
	o.replayed(n, 0, "the outbox's relay publishes them")
	return exitOK
}

// outboxDeadLetters lists, or replays into their outbox, the records an
// outbox's relay kept whole in its own dead-letter table.
func outboxDeadLetters(ctx context.Context, pool *pgxpool.Pool, verb, name string, ids []int64, limit int, toTopic string, o output, stderr io.Writer) int {
	var named []outbox.WriterOption
	if name != "" {
		named = append(named, outbox.Name(name))
	}
	if verb == "list" {
		rows, err := outbox.ListDeadLetters(ctx, pool, limit, ids, named...)
		if err != nil {
			fmt.Fprintln(stderr, "eoskit:", err)
			return exitError
		}
		o.outboxLetters(rows)
		return exitOK
	}
	n, err := outbox.ReplayDeadLetters(ctx, pool, ids, toTopic, named...)
	if err != nil {
		fmt.Fprintf(stderr, "eoskit: %v (%d moved back before)\n", err, n)
		return exitError
	}
	o.replayed(n, 0, "moved back into the outbox: its relay publishes them")
	return exitOK
}

func (o textOutput) outboxLetters(rows []outbox.DeadLetterRow) {
	if len(rows) == 0 {
		fmt.Fprintln(o.w, "no dead letters in the outbox's table")
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFOR\tKEPT\tKEY-BYTES\tVALUE-BYTES\tERROR")
	for _, r := range rows {
		to := shown(r.Topic)
		if r.Partition != nil {
			to += fmt.Sprintf("[%d]", *r.Partition)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", r.ID, to, r.CreatedAt.UTC().Format(time.RFC3339), len(r.Key), len(r.Value), oneLine(r.Error))
	}
	tw.Flush()
}

func (o jsonOutput) outboxLetters(rows []outbox.DeadLetterRow) {
	type letter struct {
		ID         int64     `json:"id"`
		Topic      string    `json:"topic"`
		Partition  *int32    `json:"partition,omitempty"`
		KeyBytes   int       `json:"key_bytes"`
		ValueBytes int       `json:"value_bytes"`
		Error      string    `json:"error"`
		CreatedAt  time.Time `json:"created_at"`
	}
	out := []letter{}
	for _, r := range rows {
		out = append(out, letter{r.ID, r.Topic, r.Partition, len(r.Key), len(r.Value), r.Error, r.CreatedAt})
	}
	o.print(out)
}

// slotActive reports whether a relay reads the replication slot now.
func slotActive(ctx context.Context, pool *pgxpool.Pool, slot string) (bool, error) {
	var active bool
	err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
	return active, err
}

func (o textOutput) tableLetters(rows []deadletter.Row) {
	if len(rows) == 0 {
		fmt.Fprintf(o.w, "no dead letters in %s\n", deadletter.Table)
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tREAD-FROM\tPARKED\tKEY-BYTES\tVALUE-BYTES\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s[%d]@%d\t%s\t%d\t%d\t%s\n", r.ID, shown(r.Group), shown(r.Topic), r.Partition, r.Offset,
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
		fmt.Fprintf(tw, "[%d]@%d\t%s\t%t\t%d\t%d\t%s\n", l.Partition, l.Offset, shown(l.Source), l.Replayed, l.KeyBytes, l.ValueBytes, oneLine(l.Error))
	}
	tw.Flush()
}

func (o textOutput) replayed(n, passed int, how string) {
	fmt.Fprintf(o.w, "replayed %d dead letters (%s)\n", n, how)
	if passed > 0 {
		fmt.Fprintf(o.w, "passed by %d outbox dead letters kept without their value: their records are in the outbox's dead-letter table: replay them with -outbox-dead-letters and the -id each warning above names\n", passed)
	}
}

// oneLine keeps an error's text on one line of the table, at most 200
// characters.
func oneLine(s string) string {
	s = strconv.Quote(s)
	s = s[1 : len(s)-1]
	if len(s) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

func (o jsonOutput) tableLetters(rows []deadletter.Row) { o.print(nonNil(rows)) }
func (o jsonOutput) topicLetters(ls []topicLetter)      { o.print(nonNil(ls)) }
func (o jsonOutput) replayed(n, passed int, _ string) {
	o.print(map[string]int{"replayed": n, "passed_by": passed})
}
