package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// The windowed tables (the eos CPU-bound table and the single-partition
// one) measure each variant over a window of work rather than over a fixed
// record count: every copier reads a backlog that holds more than it can
// copy in the run, from the start of one input topic per record size (each
// run with a fresh group and output topic), and its rate is the number of
// input records whose copies committed during the window (the growth of
// the group's committed offsets: a transaction commits its offsets with
// its output) divided by the window, counted after a warm-up that starts
// at its first commit. The producer reference writes a fresh topic and
// counts acknowledged records. Variants take turns in every round (A B C
// A B C ...), so that drift in the machine's load hits them alike. A run
// that commits the whole backlog before its window ends is discarded, the
// backlog topped up, and the run repeated.

// roles of a variant in its table.
const (
	roleAtLeastOnce = "at-least-once" // the at-least-once loop: ratio base
	roleRaw         = "raw"           // the raw GroupTransactSession: ratio base
	roleProducer    = "producer"      // the idempotent producer alone: ratio base
	roleGoal        = "goal"          // the row a goal of issue 13 is about
)

type wvariant struct {
	name  string
	start func(ctx context.Context, e *env) (running, error)
	// producer: it writes e.out from memory and reads no backlog; its
	// running's progress counts what it had acknowledged.
	producer bool
	role     string
}

type wtable struct {
	name       string
	partitions int // of the input and output topics
	sizes      []int
	// keys, when set, is how many distinct keys the backlog's records
	// are drawn from (else every record has a key of its own).
	keys     int
	variants func(size int) []wvariant
	// guess is a first guess at the fastest copier's records per second,
	// which sizes the backlog until a run shows better.
	guess func(size int) float64
}

// wresult is one run's window.
type wresult struct {
	rate float64
	// From the variant's probe, if it has one: transactions (batches)
	// committed in the window, the time they were open in total, and
	// the client's requests.
	txns     int64
	txnOpen  time.Duration
	requests map[int16]reqStat
	window   time.Duration
	// cpu is the benchmark process's CPU time during the window: the
	// variant's (and the few requests that count its progress), not the
	// broker's.
	cpu time.Duration
}

type wrow struct {
	size     int
	v        wvariant
	results  []wresult
	p50, p99 time.Duration // from a latency run; 0 when not measured
}

func (r wrow) rates() []float64 {
	rs := make([]float64, len(r.results))
	for i, res := range r.results {
		rs[i] = res.rate
	}
	return rs
}

// cpuPerRecord is the benchmark process's CPU time per record over all
// runs, in microseconds (0: not measured).
func (r wrow) cpuPerRecord() float64 {
	var cpu time.Duration
	var records float64
	for _, res := range r.results {
		cpu += res.cpu
		records += res.rate * res.window.Seconds()
	}
	if cpu == 0 || records == 0 {
		return 0
	}
	return float64(cpu.Nanoseconds()) / 1000 / records
}

// backlog is one record size's input topic.
type backlog struct {
	topic      string
	size, n    int
	partitions int
	keys       int     // distinct keys (0: one per record)
	rate       float64 // the fastest rate a copier is expected to reach
}

// windowed measures every variant of t b.runs times, interleaved.
func (b *bench) windowed(ctx context.Context, t wtable) ([]wrow, error) {
	stamp := time.Now().UnixNano()
	var rows []wrow
	backlogs := map[int]*backlog{}
	for _, size := range t.sizes {
		bl := &backlog{topic: fmt.Sprintf("bench-%s-%d-%dB-in", t.name, stamp, size), size: size, partitions: t.partitions, keys: t.keys, rate: t.guess(size)}
		if err := b.createTopics(ctx, t.partitions, bl.topic); err != nil {
			return nil, err
		}
		defer onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), bl.topic) })()
		backlogs[size] = bl
		for _, v := range t.variants(size) {
			rows = append(rows, wrow{size: size, v: v})
		}
	}
	fmt.Fprintf(os.Stderr, "%s: %d variants, %d partitions, %s window after %s warm-up, %d runs\n", t.name, len(rows), t.partitions, b.window, b.warmup, b.runs)
	for r := range b.runs {
		for i := range rows {
			row := &rows[i]
			res, err := b.windowRun(ctx, t, backlogs[row.size], row.v, fmt.Sprintf("%d-%d", r, i))
			if err != nil {
				return nil, fmt.Errorf("%s, %d B, %s: %w", t.name, row.size, row.v.name, err)
			}
			row.results = append(row.results, res)
			extra := ""
			if res.txns > 0 {
				extra = fmt.Sprintf("  %.0f records per commit, %.0f commits/s", res.rate*res.window.Seconds()/float64(res.txns), float64(res.txns)/res.window.Seconds())
			}
			if res.cpu > 0 && res.rate > 0 {
				extra += fmt.Sprintf("  %.2f µs CPU per record", float64(res.cpu.Nanoseconds())/1000/(res.rate*res.window.Seconds()))
			}
			fmt.Fprintf(os.Stderr, "  run %d  %5d B  %-70s %10.0f records/s%s\n", r+1, row.size, row.v.name, res.rate, extra)
		}
	}
	return rows, nil
}

// latencies measures every row but the producer's with latencyRun, on
// fresh topics of t's partitions.
func (b *bench) latencies(ctx context.Context, t wtable, rows []wrow) error {
	p := path{name: t.name + "-latency", partitions: t.partitions, output: true}
	for i := range rows {
		r := &rows[i]
		if r.v.producer {
			continue
		}
		e, err := b.newEnv(ctx, p, fmt.Sprint(i))
		if err != nil {
			return err
		}
		lat, err := latencyRun(ctx, variant{name: r.v.name, start: r.v.start}, e, p, r.size, 2000, 5)
		b.dropEnv(ctx, e)
		if err != nil {
			return fmt.Errorf("%s, %d B, %s latency: %w", t.name, r.size, r.v.name, err)
		}
		r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
		fmt.Fprintf(os.Stderr, "  latency  %5d B  %-40s p50 %s  p99 %s\n", r.size, r.v.name, r.p50, r.p99)
	}
	return nil
}

// replicationFactor is every topic's the bench creates, and the Kafka
// Streams peer's internal topics': the local broker is a single one.
const replicationFactor = 1

func (b *bench) createTopics(ctx context.Context, partitions int, topics ...string) error {
	resp, err := b.adm.CreateTopics(ctx, int32(partitions), replicationFactor, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	return err
}

// topUp seeds bl until it holds what its fastest expected copier could
// copy in a run, with a margin.
func (b *bench) topUp(ctx context.Context, bl *backlog) error {
	need := int(bl.rate * (b.warmup + b.window + 5*time.Second).Seconds() * 1.25)
	if bl.n >= need {
		return nil
	}
	fmt.Fprintf(os.Stderr, "  backlog %s: seeding %d more records of %d B (for up to %.0f records/s)\n", bl.topic, need-bl.n, bl.size, bl.rate)
	if err := seed(ctx, b.brokers, bl.topic, need-bl.n, bl.size, bl.keys, false); err != nil {
		return fmt.Errorf("seeding the backlog: %w", err)
	}
	bl.n = need
	return nil
}

// windowRun runs v once on a fresh group and output topic, again on a
// larger backlog if it copied all of it before its window ended.
func (b *bench) windowRun(ctx context.Context, t wtable, bl *backlog, v wvariant, suffix string) (wresult, error) {
	for attempt := 0; ; attempt++ {
		if !v.producer {
			if err := b.topUp(ctx, bl); err != nil {
				return wresult{}, err
			}
		}
		group := fmt.Sprintf("bench-%s-%d-%s", t.name, time.Now().UnixNano(), suffix)
		e := &env{brokers: b.brokers, pool: b.pool, in: bl.topic, out: group + "-out", group: group}
		if err := b.createTopics(ctx, t.partitions, e.out); err != nil {
			return wresult{}, err
		}
		dropOut := onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), e.out) })
		profile := ""
		if b.cpuProfiles != "" {
			profile = filepath.Join(b.cpuProfiles, fmt.Sprintf("%s-%dB-%s-%s.pprof", t.name, bl.size, slug(v.name), suffix))
		}
		res, drained, stalled, err := b.measureWindow(ctx, v, e, int64(bl.n), profile)
		dropOut()
		if err != nil || !drained && !stalled {
			if !v.producer {
				bl.rate = max(bl.rate, res.rate)
			}
			return res, err
		}
		if attempt == 3 {
			return wresult{}, fmt.Errorf("four attempts failed (the last: drained %v, stalled %v; backlog %d records)", drained, stalled, bl.n)
		}
		if drained {
			bl.rate = max(2*bl.rate, 1.5*res.rate)
			fmt.Fprintf(os.Stderr, "  %s copied the whole backlog within its window: again, on a larger one\n", v.name)
		} else {
			fmt.Fprintf(os.Stderr, "  %s committed nothing during its window: again\n", v.name)
		}
	}
}

// measureWindow starts v on e and measures it: it waits for its first commit,
// lets it warm up, and counts what it committed during the window. drained
// reports that it committed all total records of the backlog before the
// window ended (the rate is then too low), stalled that it committed
// nothing during the window.
func (b *bench) measureWindow(ctx context.Context, v wvariant, e *env, total int64, profile string) (res wresult, drained, stalled bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	run, err := v.start(ctx, e)
	if err != nil {
		return wresult{}, false, false, err
	}
	stop := func() error {
		cancel()
		if err := run.wait(); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	progress, progressErr := run.progress, func() error { return nil }
	if progress == nil {
		progress, progressErr = groupProgress(b.adm, e.group, e.in)
	}
	deadline := time.Now().Add(time.Minute)
	for progress() == 0 {
		if time.Now().After(deadline) {
			return wresult{}, false, false, fmt.Errorf("nothing committed after a minute (consumer: %v)", stop())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(b.warmup)

	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return wresult{}, false, false, errors.Join(err, stop())
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return wresult{}, false, false, errors.Join(err, stop())
		}
	}
	cpuOf := processCPU
	if run.cpu != nil {
		cpuOf = run.cpu
	}
	start, cpu := time.Now(), cpuOf()
	from, snap := progress(), run.probe.snapshot()
	for {
		left := b.window - time.Since(start)
		if left <= 0 {
			break
		}
		time.Sleep(min(left, 250*time.Millisecond))
		if !v.producer && progress() >= total {
			drained = true
			break
		}
	}
	elapsed, cpu := time.Since(start), cpuOf()-cpu
	to, end := progress(), run.probe.snapshot()
	if profile != "" {
		pprof.StopCPUProfile()
	}
	res = wresult{rate: float64(to-from) / elapsed.Seconds(), window: elapsed, cpu: cpu,
		txns: end.txns - snap.txns, txnOpen: end.open - snap.open, requests: map[int16]reqStat{}}
	for k, s := range end.requests {
		if d := s.sub(snap.requests[k]); d.n > 0 {
			res.requests[k] = d
		}
	}
	if err := progressErr(); err != nil {
		return res, false, false, errors.Join(err, stop())
	}
	if to == from {
		stalled = true
	}
	return res, drained, stalled, stop()
}

// groupProgress returns how many records of topic the group has committed
// (the sum of its committed offsets: the topic is read from offset 0). A
// request that fails is tried again for up to 30 seconds; after that the
// last figure stands and failed reports the error.
func groupProgress(adm *kadm.Client, group, topic string) (progress func() int64, failed func() error) {
	var last int64
	var lastErr error
	progress = func() int64 {
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			offsets, err := adm.FetchOffsets(ctx, group)
			cancel()
			if err == nil {
				var n int64
				offsets.Each(func(o kadm.OffsetResponse) {
					if o.Topic != topic {
						return
					}
					if o.Err != nil {
						err = o.Err
					}
					n += o.At
				})
				if err == nil {
					last = max(last, n)
					return last
				}
			}
			if time.Now().After(deadline) {
				lastErr = fmt.Errorf("fetching the group's committed offsets: %w", err)
				return last
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return progress, func() error { return lastErr }
}

// slug makes a variant's name a file name: letters and digits, words
// joined by dashes.
func slug(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}), "-")
}

// probe sees a processor's committed transactions (as its Metrics) and
// its client's requests (as a kgo hook). It only observes.
type probe struct {
	eoskit.NopMetrics
	txns atomic.Int64
	open atomic.Int64 // nanoseconds the committed transactions were open

	mu       sync.Mutex
	requests map[int16]reqStat
}

type reqStat struct {
	n    int64
	d    time.Duration // end to end, summed
	slow int64         // how many took slowRequest or longer
}

// slowRequest is what the requests table counts as slow: a transaction's
// first Produce that the broker holds (see the single part in main.go).
const slowRequest = 5 * time.Millisecond

func (s reqStat) sub(o reqStat) reqStat { return reqStat{s.n - o.n, s.d - o.d, s.slow - o.slow} }

type probeSnapshot struct {
	txns     int64
	open     time.Duration
	requests map[int16]reqStat
}

func newProbe() *probe { return &probe{requests: map[int16]reqStat{}} }

func (p *probe) Committed(_, _ int, d time.Duration) {
	p.txns.Add(1)
	p.open.Add(int64(d))
}

func (p *probe) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if e2e.Err() != nil {
		return
	}
	p.mu.Lock()
	s := p.requests[key]
	s.n++
	s.d += e2e.DurationE2E()
	if e2e.DurationE2E() >= slowRequest {
		s.slow++
	}
	p.requests[key] = s
	p.mu.Unlock()
}

// snapshot is safe on a nil probe (a variant without one).
func (p *probe) snapshot() probeSnapshot {
	if p == nil {
		return probeSnapshot{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	reqs := make(map[int16]reqStat, len(p.requests))
	for k, v := range p.requests {
		reqs[k] = v
	}
	return probeSnapshot{txns: p.txns.Load(), open: time.Duration(p.open.Load()), requests: reqs}
}
