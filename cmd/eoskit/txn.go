package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// runTxn runs `eoskit txn CMD FLAGS`; args start at CMD.
func runTxn(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd := args[0]
	fs := flag.NewFlagSet("eoskit txn "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	kf := addKafkaFlags(fs)
	var topics topicList
	fs.Var(&topics, "topic", "a topic to look in (repeatable; default every topic, __consumer_offsets included)")
	clientsV2 := fs.Bool("clients-speak-v2", false, "vouch that the producers' clients speak transaction protocol v2 (franz-go 1.18+, Java 4.0+), so that outcomes are read from the coordinator's state; without it every outcome is unknown")
	minAge := fs.Duration("min-age", 16*time.Minute, "report a transaction that no transactional id (this principal may describe) holds only once its producer last wrote this long ago, and it is unchanged when looked at again this long after (longer than the cluster's transaction.max.timeout.ms plus its abort cleanup interval, 15 m and 10 s by default; 0: at once)")
	var (
		id         *string
		partition  *int
		producerID *int64
		outcome    *string
		dryRun     *bool
	)
	switch cmd {
	case "find-hanging":
	case "describe":
		id = fs.String("id", "", "the transactional id (required)")
	case "close":
		partition = fs.Int("partition", -1, "the partition (required)")
		producerID = fs.Int64("producer-id", -1, "the producer id that holds the transaction open (required)")
		outcome = fs.String("outcome", "auto", "the marker to write: auto (the coordinator's outcome; refused when unknown), commit or abort")
		dryRun = fs.Bool("dry-run", false, "show the marker, write nothing")
	default:
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	switch {
	case cmd == "describe" && *id == "":
		fmt.Fprintln(stderr, "describe needs -id")
		return exitUsage
	case cmd == "close" && (len(topics) != 1 || *partition < 0 || *producerID < 0):
		fmt.Fprintln(stderr, "close needs one -topic, -partition and -producer-id (as find-hanging prints them)")
		return exitUsage
	case *minAge < 0:
		fmt.Fprintf(stderr, "-min-age %v: want a duration of 0 or more\n", *minAge)
		return exitUsage
	case cmd == "close" && *outcome != "auto" && *outcome != "commit" && *outcome != "abort":
		fmt.Fprintf(stderr, "-outcome %q: want auto, commit or abort\n", *outcome)
		return exitUsage
	}

	conn, err := kf.connect()
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage // settings missing, or given that cannot be honoured
	}
	// find-hanging and close may wait -min-age to look again; reaching
	// the cluster, and describe, have -timeout alone.
	deadline := *kf.timeout
	if cmd != "describe" {
		// A -timeout for the looks before the wait, and one for those
		// (and close's marker) after it.
		deadline = 2**kf.timeout + *minAge
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	connectCtx, connected := context.WithTimeout(ctx, *kf.timeout)
	defer connected()
	t, err := connect(connectCtx, strings.Join(conn.seeds, ","), conn.opts, *clientsV2)
	if err != nil {
		fmt.Fprintf(stderr, "eoskit: %v\n", err)
		return exitError
	}
	defer t.close()
	var o output = textOutput{stdout}
	if *kf.json {
		o = jsonOutput{stdout}
	}
	find := txnscan.FindOptions{ClientsV2: t.clientsV2, MinAge: *minAge, Waiting: func(n int, d time.Duration) {
		fmt.Fprintf(stderr, "eoskit: %d open transactions (by partition and producer) are held by no transactional id this principal may describe; looking again in %v to tell a live one from a hanging one (-min-age)\n", n, d)
	}}
	switch cmd {
	case "find-hanging":
		hangs, looked, err := t.findHanging(ctx, topics, find)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: find hanging transactions: %v\n", err)
			return exitError
		}
		o.hangs(hangs, looked)
		if len(hangs) > 0 {
			return exitFound
		}
	case "describe":
		d, err := t.describe(ctx, *id, topics)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: describe %s: %v\n", *id, err)
			return exitError
		}
		o.described(d)
	case "close":
		c, err := t.closeHang(ctx, topics[0], int32(*partition), *producerID, *outcome, *dryRun, find)
		if err != nil {
			fmt.Fprintf(stderr, "eoskit: close: %v\n", err)
			return exitError
		}
		o.closed(c)
	}
	return exitOK
}

// txnTool holds the connection to the cluster.
type txnTool struct {
	cl  *kgo.Client
	adm *kadm.Client
	// clientsV2: outcomes may be read from the coordinator's state
	// (txnscan.Find).
	clientsV2 bool
}

// connect reaches the cluster; clientsV2 is the operator's word that the
// producers' clients speak transaction protocol v2, which counts only on a
// cluster that offers it.
func connect(ctx context.Context, brokers string, opts []kgo.Opt, clientsV2 bool) (*txnTool, error) {
	// A setting no retry cures (a CA, a password) is said at once, not
	// after -timeout.
	if err := loop.ConnectError(ctx, "eoskit", opts); err != nil {
		return nil, fmt.Errorf("reach %s: %w", brokers, err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	level, err := txnscan.TransactionVersion(ctx, cl)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("reach %s: %w", brokers, err)
	}
	return &txnTool{cl: cl, adm: kadm.NewClient(cl), clientsV2: clientsV2 && level >= 2}, nil
}

func (t *txnTool) close() { t.cl.Close() }

// partitions returns every partition of topics (of every topic when none
// is given, internal ones included).
func (t *txnTool) partitions(ctx context.Context, topics []string) (kadm.TopicsSet, error) {
	var details kadm.TopicDetails
	var err error
	if len(topics) == 0 {
		details, err = t.adm.ListTopicsWithInternal(ctx)
	} else {
		details, err = t.adm.ListTopicsWithInternal(ctx, topics...)
	}
	if err == nil {
		err = details.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	return details.TopicsSet(), nil
}

// findHanging returns the hanging transactions in topics, and how many
// partitions it looked at.
func (t *txnTool) findHanging(ctx context.Context, topics []string, find txnscan.FindOptions) ([]txnscan.Hang, int, error) {
	set, err := t.partitions(ctx, topics)
	if err != nil {
		return nil, 0, err
	}
	looked := 0
	for _, ps := range set {
		looked += len(ps)
	}
	hangs, err := txnscan.Find(ctx, t.adm, set, find)
	return hangs, looked, err
}

// description is what describe prints.
type description struct {
	Coordinator kadm.DescribedTransaction `json:"coordinator"`
	// Open is every partition holding a transaction of its producer open,
	// with what each is.
	Open []openPartition `json:"open"`
}

type openPartition struct {
	kadm.DescribedProducer
	State string `json:"state"`
}

func (t *txnTool) describe(ctx context.Context, id string, topics []string) (*description, error) {
	described, err := t.adm.DescribeTransactions(ctx, id)
	if err != nil {
		return nil, err
	}
	coord, ok := described[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("the cluster did not describe transactional id %q", id)
	case coord.Err != nil:
		return nil, fmt.Errorf("the coordinator answered %v", coord.Err)
	}
	set, err := t.partitions(ctx, topics)
	if err != nil {
		return nil, err
	}
	open, err := txnscan.Open(ctx, t.adm, set)
	if err != nil {
		return nil, err
	}
	d := &description{Coordinator: coord}
	for k, p := range open {
		if k.ProducerID == coord.ProducerID {
			d.Open = append(d.Open, openPartition{p, txnscan.Classify(coord, p).String()})
		}
	}
	return d, nil
}

// closing is what close did or, with -dry-run, would do.
type closing struct {
	Hang    txnscan.Hang `json:"hang"`
	Commit  bool         `json:"commit"`
	Written bool         `json:"written"`
}

// errRefused is a close that would risk exactly-once.
var errRefused = errors.New("refused")

func (t *txnTool) closeHang(ctx context.Context, topic string, partition int32, producerID int64, outcome string, dryRun bool, find txnscan.FindOptions) (*closing, error) {
	find.Producer = &producerID // another producer's transaction is not waited for
	hangs, err := txnscan.Find(ctx, t.adm, kadm.TopicsSet{topic: {partition: {}}}, find)
	if err != nil {
		return nil, err
	}
	var h *txnscan.Hang
	for i := range hangs {
		if hangs[i].ProducerID == producerID {
			h = &hangs[i]
		}
	}
	if h == nil {
		return nil, fmt.Errorf("%w: %s[%d] holds no hanging transaction of producer id %d (closed, live, or never there: run find-hanging)", errRefused, topic, partition, producerID)
	}
	var commit bool
	switch {
	case outcome == "auto" && h.Outcome == "unknown":
		return nil, fmt.Errorf("%w: the outcome of producer id %d's transaction in %s[%d] is unknown (evidence: %s); find out whether it committed (for example, whether its outputs are visible to a read_committed reader) and give -outcome commit or -outcome abort", errRefused, producerID, topic, partition, h.Evidence)
	case outcome == "auto":
		commit = h.Outcome == "committed"
	case h.Outcome != "unknown" && (outcome == "commit") != (h.Outcome == "committed"):
		return nil, fmt.Errorf("%w: -outcome %s contradicts the transaction's outcome, %s (evidence: %s); a marker of the other outcome loses or duplicates records", errRefused, outcome, h.Outcome, h.Evidence)
	default:
		commit = outcome == "commit"
	}
	c := &closing{Hang: *h, Commit: commit}
	if dryRun {
		return c, nil
	}
	resp, err := t.adm.WriteTxnMarkers(ctx, kadm.TxnMarkers{
		ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch, CoordinatorEpoch: h.CoordinatorEpoch,
		Commit: commit, Topics: kadm.TopicsSet{topic: {partition: {}}},
	})
	if err == nil {
		resp.EachPartition(func(r kadm.TxnMarkersPartitionResponse) { err = errors.Join(err, r.Err) })
	}
	if err != nil {
		if txnscan.IsAuthError(err) {
			return nil, fmt.Errorf("write the marker: %w (WriteTxnMarkers needs ClusterAction on the cluster, beside Read on the topic and Describe on the transactional ids that finding the transaction takes)", err)
		}
		return nil, fmt.Errorf("write the marker: %w", err)
	}
	open, err := txnscan.Open(ctx, t.adm, kadm.TopicsSet{topic: {partition: {}}})
	if err != nil {
		return nil, fmt.Errorf("the marker was written; checking that the partition let go failed: %w", err)
	}
	if q, ok := open[txnscan.Key{ProducerID: producerID, Topic: topic, Partition: partition}]; ok && q.CurrentTxnStartOffset == h.CurrentTxnStartOffset {
		return nil, fmt.Errorf("the marker was written but %s[%d] still holds the transaction open", topic, partition)
	}
	c.Written = true
	return c, nil
}

func (o textOutput) hangs(hs []txnscan.Hang, looked int) {
	if len(hs) == 0 {
		fmt.Fprintf(o.w, "no hanging transactions in %d partitions\n", looked)
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPRODUCER-ID\tEPOCH\tSTART-OFFSET\tTRANSACTIONAL-ID\tCOORDINATOR\tOUTCOME\tEVIDENCE")
	for _, h := range hs {
		coord := "-"
		if h.TransactionalID != "" {
			coord = fmt.Sprintf("%s@%d", shown(h.Coordinator.State), h.Coordinator.ProducerEpoch)
		}
		fmt.Fprintf(tw, "%s[%d]\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", shown(h.Topic), h.Partition, h.ProducerID, h.ProducerEpoch,
			h.CurrentTxnStartOffset, shown(cmp.Or(h.TransactionalID, "-")), coord, h.Outcome, shown(h.Evidence))
	}
	tw.Flush()
}

func (o textOutput) described(d *description) {
	c := d.Coordinator
	fmt.Fprintf(o.w, "transactional id %s: producer id %d, epoch %d, %s (coordinator node %d, timeout %d ms)\n",
		shown(c.TxnID), c.ProducerID, c.ProducerEpoch, shown(c.State), c.Coordinator, c.TimeoutMillis)
	if len(d.Open) == 0 {
		fmt.Fprintln(o.w, "no partition holds a transaction of its producer open")
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tEPOCH\tSTART-OFFSET\tSTATE")
	for _, p := range d.Open {
		fmt.Fprintf(tw, "%s[%d]\t%d\t%d\t%s\n", shown(p.Topic), p.Partition, p.ProducerEpoch, p.CurrentTxnStartOffset, shown(p.State))
	}
	tw.Flush()
}

func (o textOutput) closed(c *closing) {
	verb := "would write"
	if c.Written {
		verb = "wrote"
	}
	marker := map[bool]string{true: "a COMMIT", false: "an ABORT"}[c.Commit]
	fmt.Fprintf(o.w, "%s %s marker to %s[%d] for producer id %d epoch %d (coordinator epoch %d), closing the transaction open since offset %d; evidence: %s\n",
		verb, marker, shown(c.Hang.Topic), c.Hang.Partition, c.Hang.ProducerID, c.Hang.ProducerEpoch, c.Hang.CoordinatorEpoch, c.Hang.CurrentTxnStartOffset, shown(c.Hang.Evidence))
}

func (o jsonOutput) hangs(hs []txnscan.Hang, _ int) { o.print(nonNil(hs)) }
func (o jsonOutput) described(d *description)       { o.print(d) }
func (o jsonOutput) closed(c *closing)              { o.print(c) }
