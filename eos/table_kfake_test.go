package eos_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/verify"
)

// errBadCase is the join tests' bad record's fault.
var errBadCase = errors.New("a bad case")

// joinCasesTo is the join tests' join: for each case, a record to topic
// of the case's partition and offset and the region's value as of its
// time ("-" for none); a case whose value is "bad" fails.
func joinCasesTo(topic string) func(context.Context, *kgo.Record, []byte, bool) ([]*kgo.Record, error) {
	return func(_ context.Context, r *kgo.Record, value []byte, ok bool) ([]*kgo.Record, error) {
		if string(r.Value) == "bad" {
			return nil, errBadCase
		}
		v := "-"
		if ok {
			v = string(value)
		}
		return []*kgo.Record{{Topic: topic, Key: r.Key, Value: fmt.Appendf(nil, "%d/%d/%s", r.Partition, r.Offset, v)}}, nil
	}
}

var joinCases = joinCasesTo("joined")

// seedJoin writes the region table (every region renamed four times, one
// deleted, at times spread over the cases', a region's name up to 59 s
// after its version's start, so that a partition's table records are not
// in time order: the advance must stop at the first later one) and then
// the cases, out of
// order in time by up to 10 s either way, some of regions the table never
// holds, some bad.
func seedJoin(t *testing.T, ctx context.Context, produce func(...*kgo.Record) error, base time.Time, cases int) {
	t.Helper()
	var table []*kgo.Record
	for v := range 4 {
		for k := range 8 {
			table = append(table, &kgo.Record{Topic: "regions", Key: fmt.Appendf(nil, "r%d", k),
				Value: fmt.Appendf(nil, "region %d v%d", k, v), Timestamp: base.Add(time.Duration(v*50+k*13%60) * time.Second)})
		}
	}
	table = append(table, &kgo.Record{Topic: "regions", Key: []byte("r3"), Timestamp: base.Add(120 * time.Second)})
	if err := produce(table...); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []*kgo.Record
	for i := range cases {
		// Over 220 s in order, each case up to 10 s early or late.
		at := base.Add(time.Duration(i)*220*time.Second/time.Duration(cases) + time.Duration(rng.IntN(20_000)-10_000)*time.Millisecond)
		r := &kgo.Record{Topic: "cases", Key: fmt.Appendf(nil, "r%d", rng.IntN(10)), Timestamp: at}
		if i%97 == 13 {
			r.Value = []byte("bad")
		}
		stream = append(stream, r)
	}
	if err := produce(stream...); err != nil {
		t.Fatal(err)
	}
}

// checkJoin reads what the join wrote to joined and checks it against
// verify.TableJoin of the committed table and cases: every good case
// joined once, with the table as of its time.
func checkJoin(t *testing.T, conn []kgo.Opt, cases, table, joined string) {
	t.Helper()
	c := compareJoin(t, conn, cases, table, joined)
	if c.missing > 0 || c.wrong > 0 || c.joined != c.want {
		t.Fatalf("%d cases joined, %d expected: %d missing, %d wrong", c.joined, c.want, c.missing, c.wrong)
	}
	// The test must be able to fail: the cases met the table at several
	// of its versions, and some met no region.
	if !c.unnamed || c.renamed < c.want/4 || c.values < 16 || c.bad == 0 {
		t.Fatalf("a weak test: a case without a region %t, %d of %d joined with a middle version, %d values seen, %d bad cases",
			c.unnamed, c.renamed, c.want, c.values, c.bad)
	}
	t.Logf("%d cases joined with the table as of their time (%d values seen, %d a middle version), %d bad cases dead-lettered", c.joined, c.values, c.renamed, c.bad)
}

// joinComparison is how what a join wrote compares with verify.TableJoin.
type joinComparison struct {
	want, joined, missing, wrong int
	// values is how many values the truth joined, renamed how many cases
	// met a region's name before its last, unnamed whether any met none.
	values, renamed int
	unnamed         bool
	bad             int // cases dead-lettered
}

func compareJoin(t *testing.T, conn []kgo.Opt, cases, table, joined string) joinComparison {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	read := func(topic string) []*kgo.Record {
		recs, err := verify.ReadTopicWith(ctx, conn, topic, kgo.ReadCommitted(), true, false, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	var good []*kgo.Record
	bad := 0
	for _, r := range read(cases) {
		if string(r.Value) == "bad" {
			bad++
			continue
		}
		good = append(good, r)
	}
	want := verify.TableJoin(read(table), good)
	got := map[verify.Position]string{}
	for _, r := range read(joined) {
		var p int32
		var o int64
		var v string
		parts := strings.SplitN(string(r.Value), "/", 3)
		if len(parts) != 3 {
			t.Fatalf("a joined record %q", r.Value)
		}
		fmt.Sscan(parts[0], &p)
		fmt.Sscan(parts[1], &o)
		v = parts[2]
		at := verify.Position{Topic: cases, Partition: p, Offset: o}
		if prev, dup := got[at]; dup {
			t.Fatalf("case %s joined twice (%q, %q)", at, prev, v)
		}
		got[at] = v
	}
	// A region's names end in " v<version>"; the last version is the
	// one each region's name ends at.
	version := func(name string) int {
		v, _ := strconv.Atoi(name[strings.LastIndexByte(name, 'v')+1:])
		return v
	}
	last := 0
	for _, j := range want {
		if j.OK {
			last = max(last, version(string(j.Value)))
		}
	}
	wrong, missing, seen, renamed := 0, 0, map[string]bool{}, 0
	for at, j := range want {
		w := "-"
		if j.OK {
			w = string(j.Value)
		}
		g, ok := got[at]
		switch {
		case !ok:
			missing++
		case g != w:
			if wrong++; wrong <= 3 {
				t.Logf("case %s joined with %q, the table as of its time holds %q", at, g, w)
			}
		}
		seen[w] = true
		if w != "-" && version(w) < last {
			renamed++
		}
	}
	return joinComparison{want: len(want), joined: len(got), missing: missing, wrong: wrong,
		values: len(seen), renamed: renamed, unnamed: seen["-"], bad: bad}
}

// joinCluster is a kfake cluster of one broker with topics, three
// partitions each, and a client of it, both closed when t ends.
func joinCluster(t *testing.T, topics ...string) (brokers []string, seed *kgo.Client) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers = cluster.ListenAddrs()
	if seed, err = kgo.NewClient(kgo.SeedBrokers(brokers...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(seed.Close)
	return brokers, seed
}

// joinOpts are the join tests' processor options.
func joinOpts(t *testing.T, brokers []string, table *eos.Table) []eos.ProcessorOption {
	return []eos.ProcessorOption{eos.Brokers(brokers...), eos.Group("join"), eos.Topics("cases"), eos.TransactionalID("join-0"),
		eos.CommitInterval(20 * time.Millisecond), eos.MaxRecordsPerCommit(17), eos.Logger(testLogger(t)),
		eos.OnHandlerError(eos.DeadLetter("dead")), eos.WithTables(table),
		eos.Changelog("join-changelog", eos.CreateChangelog())}
}

// joinInTurn runs two processors of the join group in turn, each made by
// newProcessor: the first until it committed some cases, the second
// (restoring what the first committed) until the group committed them
// all.
func joinInTurn(t *testing.T, ctx context.Context, adm *kadm.Client, newProcessor func() (*eos.Processor, error)) {
	t.Helper()
	for run := range 2 {
		p, err := newProcessor()
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		if run == 0 {
			for p.Health().LastCommit.IsZero() && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		} else {
			waitCommitted(t, ctx, adm, "join", "cases")
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
	}
}

// waitCommitted waits until group committed every record of topic.
func waitCommitted(t *testing.T, ctx context.Context, adm *kadm.Client, group, topic string) {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for {
		offsets, err := adm.FetchOffsets(ctx, group)
		done := err == nil
		ends.Each(func(e kadm.ListedOffset) {
			o, ok := offsets.Lookup(topic, e.Partition)
			done = done && (e.Offset == 0 || ok && o.At == e.Offset) // an empty partition has nothing to commit
		})
		if done {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("group %q did not commit %q to its end (%v)", group, topic, ends)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cases joined with region names as of their time, over three partitions,
// by a processor stopped midway and a second one restoring its state (the
// table's position included) from the changelog: every case joined once,
// with the table version its time reaches.
func TestJoinTableAsOfEachRecordsTime(t *testing.T) {
	brokers, seed := joinCluster(t, "cases", "regions", "joined", "joined-globally", "dead")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seedJoin(t, ctx, func(rs ...*kgo.Record) error { return seed.ProduceSync(ctx, rs...).FirstErr() }, time.Now().Add(-time.Hour), 600)

	table := eos.NewTable("regions")
	adm := kadm.NewClient(seed)
	joinInTurn(t, ctx, adm, func() (*eos.Processor, error) {
		return eos.NewProcessor(eos.JoinTable(table, joinCases), joinOpts(t, brokers, table)...)
	})
	checkJoin(t, []kgo.Opt{kgo.SeedBrokers(brokers...)}, "cases", "regions", "joined")

	// The negative control: the same cases joined by a lookup in a
	// global table, which holds the table's latest version whatever the
	// case's time, are joined exactly once, and many wrongly.
	regions := eos.NewGlobalTable("regions")
	lookup := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		v, ok, err := regions.Get(r.Key)
		if err != nil {
			return nil, err
		}
		return joinCasesTo("joined-globally")(ctx, r, v, ok)
	}
	p, err := eos.NewProcessor(lookup, eos.Brokers(brokers...), eos.Group("join-globally"), eos.Topics("cases"), eos.TransactionalID("join-globally-0"),
		eos.CommitInterval(20*time.Millisecond), eos.Logger(testLogger(t)), eos.OnHandlerError(eos.DeadLetter("dead")), eos.WithGlobalTables(regions))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	waitCommitted(t, ctx, adm, "join-globally", "cases")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := compareJoin(t, []kgo.Opt{kgo.SeedBrokers(brokers...)}, "cases", "regions", "joined-globally")
	if c.missing > 0 || c.joined != c.want || c.wrong < c.want/4 {
		t.Fatalf("the global table's control joined %d of %d cases, %d wrongly: it should get a quarter wrong at least", c.joined, c.want, c.wrong)
	}
	t.Logf("control: a global table joined %d of %d cases wrongly", c.wrong, c.want)
}

// A table whose partition count is not the input's is refused at Run,
// naming both; and the options that cannot hold a table are refused at
// NewProcessor.
func TestJoinTableRefusals(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "cases", "joined", "dead"), kfake.SeedTopics(2, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	table := eos.NewTable("regions")
	p, err := eos.NewProcessor(eos.JoinTable(table, joinCases), joinOpts(t, brokers, table)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Run(ctx)
	var ce *eoskit.ConfigError
	if !errors.As(err, &ce) || ce.Setting != "WithTables" || !strings.Contains(ce.Reason, "2 partitions") || !strings.Contains(ce.Reason, "has 3") {
		t.Fatalf("Run with a table of 2 partitions and an input of 3: %v", err)
	}

	for name, opts := range map[string][]eos.ProcessorOption{
		"no changelog":     {eos.WithTables(table)},
		"key order":        {eos.WithTables(table), eos.Changelog("c"), eos.Concurrency(4, eos.KeyOrder)},
		"ttl":              {eos.WithTables(table), eos.Changelog("c", eos.TTL(time.Hour))},
		"input":            {eos.WithTables(eos.NewTable("cases")), eos.Changelog("c")},
		"changelog":        {eos.WithTables(eos.NewTable("c")), eos.Changelog("c")},
		"twice":            {eos.WithTables(table, table), eos.Changelog("c")},
		"one topic twice":  {eos.WithTables(table, eos.NewTable("regions")), eos.Changelog("c")},
		"refresh interval": {eos.WithTables(eos.NewTable("regions", eos.RefreshInterval(time.Second))), eos.Changelog("c")},
	} {
		all := append([]eos.ProcessorOption{eos.Brokers(brokers...), eos.Group("g"), eos.Topics("cases"), eos.TransactionalID("x")}, opts...)
		if _, err := eos.NewProcessor(eos.JoinTable(table, joinCases), all...); !errors.As(err, &ce) || ce.Setting != "WithTables" {
			t.Errorf("%s: NewProcessor = %v, want a ConfigError for WithTables", name, err)
		}
	}
}

// Two co-partitioned tables joined in one handler each join every case
// with their own version as of its time: each table's position is its
// own (in the state and in the partition's memo), through two processors
// in turn (the second restoring both positions). The second table is the
// first's names at other times, so that a join reading one table's
// position for the other's records names cases wrongly.
func TestTwoTablesJoinedInOneHandlerKeepTheirOwnPositions(t *testing.T) {
	brokers, seed := joinCluster(t, "cases", "regions", "names", "joined", "joined-names", "dead")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := time.Now().Add(-time.Hour)
	seedJoin(t, ctx, func(rs ...*kgo.Record) error { return seed.ProduceSync(ctx, rs...).FirstErr() }, base, 600)
	var names []*kgo.Record
	for v := range 4 {
		for k := range 8 {
			names = append(names, &kgo.Record{Topic: "names", Key: fmt.Appendf(nil, "r%d", k),
				Value: fmt.Appendf(nil, "name %d v%d", k, v), Timestamp: base.Add(time.Duration(v*50+25+k*7%60) * time.Second)})
		}
	}
	if err := seed.ProduceSync(ctx, names...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	regions, named := eos.NewTable("regions"), eos.NewTable("names")
	joinRegion, joinName := eos.JoinTable(regions, joinCases), eos.JoinTable(named, joinCasesTo("joined-names"))
	both := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		a, err := joinRegion(ctx, r)
		if err != nil {
			return nil, err
		}
		b, err := joinName(ctx, r)
		return append(a, b...), err
	}
	joinInTurn(t, ctx, kadm.NewClient(seed), func() (*eos.Processor, error) {
		return eos.NewProcessor(both, append(joinOpts(t, brokers, regions), eos.WithTables(named))...)
	})
	conn := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	checkJoin(t, conn, "cases", "regions", "joined")
	checkJoin(t, conn, "cases", "names", "joined-names")
}
