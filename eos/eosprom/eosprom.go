// Package eosprom reports what eoskit's runners do to Prometheus: one
// Metrics serves an eos.Processor, an offsetstore.Runner, a
// dedup.Consumer and an outbox.Relay alike, each series labelled with the
// runner's path.
//
//	m, err := eosprom.New(prometheus.DefaultRegisterer)
//	p, err := eos.NewProcessor(h, ..., eos.WithMetrics(m))
//	r, err := offsetstore.NewRunner(pool, h2, ..., offsetstore.WithMetrics(m))
//
// Metrics, under the namespace (default "eoskit") and subsystem "processor",
// each with a path label ("eos", "offsetstore", "dedup", "outbox"):
//
//	transactions_total{outcome="committed"|"aborted", reason}  counter
//	records_in_total, records_out_total                        counters (committed work only)
//	rebalances_total                                           counter
//	fencings_total                                             counter
//	hanging_transactions_total{outcome}                        counter
//	transaction_duration_seconds{outcome}                      histogram
//	handler_duration_seconds{outcome="ok"|"error"}             histogram
//	handlers_in_flight                                         gauge
//	dead_letters_total                                         counter
//	late_records_total                                         counter (windowed aggregations' late records, each time handled)
//	restored_records_total{topic}                              counter (changelog records applied by restores of keyed state; topic: the changelog)
//	restores_total{topic}                                      counter (restores of a changelog partition, at each assignment: a memory store reads its whole changelog each time)
//	lag{group, topic, partition}                               gauge (as of the partition's last poll; removed on revoke)
//
// For the franz-go client's own metrics (bytes, requests, buffered records),
// add plugin/kprom to the runner through its ClientOptions.
package eosprom

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// Metrics holds the collectors. It is an eoskit.PathMetrics: each runner it
// is given to reports through the view of its own path. One value may be
// shared by every runner of a process. Used directly as an eoskit.Metrics, it
// reports under path "eos".
type Metrics struct {
	transactions *prometheus.CounterVec
	recordsIn    *prometheus.CounterVec
	recordsOut   *prometheus.CounterVec
	rebalances   *prometheus.CounterVec
	fencings     *prometheus.CounterVec
	hanging      *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	handler      *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	deadLetters  *prometheus.CounterVec
	late         *prometheus.CounterVec
	restored     *prometheus.CounterVec
	restores     *prometheus.CounterVec
	lag          *prometheus.GaugeVec
	eos          *path
}

var (
	_ eoskit.Metrics     = (*Metrics)(nil)
	_ eoskit.PathMetrics = (*Metrics)(nil)
	_ eos.HangingMetrics = (*Metrics)(nil)
	_ eos.HangingMetrics = (*path)(nil)
	_ eos.LateMetrics    = (*Metrics)(nil)
	_ eos.LateMetrics    = (*path)(nil)
	// A processor reports through ForPath's view (internal/loop's
	// observer), so the view must take what the processor reports.
	_ eos.RestoreMetrics = (*Metrics)(nil)
	_ eos.RestoreMetrics = (*path)(nil)
)

// Option configures New.
type Option func(*config)

type config struct {
	namespace string
	labels    prometheus.Labels
	buckets   []float64
}

// Namespace sets the metric namespace. Default: "eoskit".
func Namespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// ConstLabels adds labels to every metric, for example the application
// name when several processes share a registry. Default: none.
func ConstLabels(l prometheus.Labels) Option { return func(c *config) { c.labels = l } }

// DurationBuckets sets the histogram buckets of the transaction and handler
// durations, in seconds. Default: 1ms to about 16s, doubling.
func DurationBuckets(b []float64) Option { return func(c *config) { c.buckets = b } }

// New creates the collectors and registers them with reg. It fails if reg
// already holds collectors of the same names and labels.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	c := config{namespace: "eoskit", buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}
	for _, o := range opts {
		o(&c)
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: c.namespace, Subsystem: "processor", Name: name, Help: help, ConstLabels: c.labels},
			append([]string{"path"}, labels...))
	}
	histogram := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: c.namespace, Subsystem: "processor", Name: name, Help: help, ConstLabels: c.labels,
			Buckets: c.buckets}, []string{"path", "outcome"})
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: c.namespace, Subsystem: "processor", Name: name, Help: help, ConstLabels: c.labels},
			append([]string{"path"}, labels...))
	}
	m := &Metrics{
		transactions: counter("transactions_total", "Transactions (or batches, under the weaker semantics) ended, by outcome and abort reason.", "outcome", "reason"),
		recordsIn:    counter("records_in_total", "Input records of committed transactions."),
		recordsOut:   counter("records_out_total", "Output records of committed transactions."),
		rebalances:   counter("rebalances_total", "Times the group took partitions from a runner."),
		fencings:     counter("fencings_total", "Times a newer instance with the same transactional id fenced a processor."),
		hanging: counter("hanging_transactions_total",
			"Hanging transactions of a processor found in a partition, by the outcome their records elsewhere have (committed, aborted, unknown).", "outcome"),
		duration:    histogram("transaction_duration_seconds", "Time from the start of a transaction to its commit or abort."),
		handler:     histogram("handler_duration_seconds", "Time a handler call took, by whether it failed (error or panic)."),
		inFlight:    gauge("handlers_in_flight", "Handler calls under way."),
		deadLetters: counter("dead_letters_total", "Records dead-lettered in committed work."),
		late:        counter("late_records_total", "Records a windowed aggregation found late (all their windows closed), each time handled."),
		restored:    counter("restored_records_total", "Changelog records applied by restores of keyed state.", "topic"),
		restores:    counter("restores_total", "Restores of a changelog partition (a store made current before its partition's first record).", "topic"),
		lag:         gauge("lag", "Records after the last one polled, per partition, as of its last poll.", "group", "topic", "partition"),
	}
	for _, col := range []prometheus.Collector{m.transactions, m.recordsIn, m.recordsOut, m.rebalances, m.fencings, m.hanging, m.duration,
		m.handler, m.inFlight, m.deadLetters, m.late, m.restored, m.restores, m.lag} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	m.eos = m.forPath("eos", "")
	return m, nil
}

// ForPath implements eoskit.PathMetrics: the view of m whose series carry
// path (and, for lag, group).
func (m *Metrics) ForPath(p, group string) eoskit.Metrics { return m.forPath(p, group) }

func (m *Metrics) forPath(p, group string) *path {
	return &path{m: m, name: p, group: group,
		recordsIn: m.recordsIn.WithLabelValues(p), recordsOut: m.recordsOut.WithLabelValues(p),
		committed: m.transactions.WithLabelValues(p, "committed", ""), committedFor: m.duration.WithLabelValues(p, "committed"),
		abortedFor: m.duration.WithLabelValues(p, "aborted"), rebalances: m.rebalances.WithLabelValues(p), fencings: m.fencings.WithLabelValues(p),
		ok: m.handler.WithLabelValues(p, "ok"), failed: m.handler.WithLabelValues(p, "error"), inFlight: m.inFlight.WithLabelValues(p),
		deadLetters: m.deadLetters.WithLabelValues(p), late: m.late.WithLabelValues(p)}
}

// path is the view of the collectors for one path, its fixed series looked
// up once.
type path struct {
	m                                    *Metrics
	name, group                          string
	recordsIn, recordsOut, committed     prometheus.Counter
	rebalances, fencings, deadLetters    prometheus.Counter
	late                                 prometheus.Counter
	committedFor, abortedFor, ok, failed prometheus.Observer
	inFlight                             prometheus.Gauge
}

func (p *path) Committed(recordsIn, recordsOut int, d time.Duration) {
	p.committed.Inc()
	p.recordsIn.Add(float64(recordsIn))
	p.recordsOut.Add(float64(recordsOut))
	p.committedFor.Observe(d.Seconds())
}

func (p *path) Aborted(reason string, d time.Duration) {
	p.m.transactions.WithLabelValues(p.name, "aborted", reason).Inc()
	p.abortedFor.Observe(d.Seconds())
}

func (p *path) Rebalanced()        { p.rebalances.Inc() }
func (p *path) Fenced()            { p.fencings.Inc() }
func (p *path) HandlerStarted()    { p.inFlight.Inc() }
func (p *path) DeadLettered(n int) { p.deadLetters.Add(float64(n)) }
func (p *path) LateRecord()        { p.late.Inc() }

func (p *path) Handled(d time.Duration, failed bool) {
	p.inFlight.Dec()
	if failed {
		p.failed.Observe(d.Seconds())
	} else {
		p.ok.Observe(d.Seconds())
	}
}

func (p *path) Lag(topic string, partition int32, lag int64) {
	if lag < 0 { // no longer this runner's: another reports it now
		p.m.lag.DeleteLabelValues(p.name, p.group, topic, strconv.Itoa(int(partition)))
		return
	}
	p.m.lag.WithLabelValues(p.name, p.group, topic, strconv.Itoa(int(partition))).Set(float64(lag))
}

func (p *path) HangingTransaction(outcome string) {
	p.m.hanging.WithLabelValues(p.name, outcome).Inc()
}

// Committed implements eoskit.Metrics, under path "eos"; so do the methods
// below.
func (m *Metrics) Committed(recordsIn, recordsOut int, d time.Duration) {
	m.eos.Committed(recordsIn, recordsOut, d)
}

func (m *Metrics) Aborted(reason string, d time.Duration)       { m.eos.Aborted(reason, d) }
func (m *Metrics) Rebalanced()                                  { m.eos.Rebalanced() }
func (m *Metrics) Fenced()                                      { m.eos.Fenced() }
func (m *Metrics) HandlerStarted()                              { m.eos.HandlerStarted() }
func (m *Metrics) Handled(d time.Duration, failed bool)         { m.eos.Handled(d, failed) }
func (m *Metrics) DeadLettered(n int)                           { m.eos.DeadLettered(n) }
func (m *Metrics) Lag(topic string, partition int32, lag int64) { m.eos.Lag(topic, partition, lag) }

// HangingTransaction implements eos.HangingMetrics.
func (m *Metrics) HangingTransaction(outcome string) { m.eos.HangingTransaction(outcome) }

// LateRecord implements eos.LateMetrics.
func (m *Metrics) LateRecord() { m.eos.LateRecord() }

// Restored implements eos.RestoreMetrics.
func (m *Metrics) Restored(topic string, partition int32, from int64, records int, took time.Duration) {
	m.eos.Restored(topic, partition, from, records, took)
}

// Restored implements eos.RestoreMetrics for the path's view.
func (p *path) Restored(topic string, _ int32, _ int64, records int, _ time.Duration) {
	p.m.restores.WithLabelValues(p.name, topic).Inc()
	p.m.restored.WithLabelValues(p.name, topic).Add(float64(records))
}
