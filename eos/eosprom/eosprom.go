// Package eosprom reports an eos.Processor's metrics to Prometheus.
//
//	m, err := eosprom.New(prometheus.DefaultRegisterer)
//	p, err := eos.NewProcessor(h, ..., eos.WithMetrics(m))
//
// Metrics, under the namespace (default "eoskit") and subsystem "processor":
//
//	transactions_total{outcome="committed"|"aborted", reason}  counter
//	records_in_total, records_out_total                        counters (committed work only)
//	rebalances_total                                           counter
//	fencings_total                                             counter
//	hanging_transactions_total{outcome}                        counter
//	transaction_duration_seconds{outcome}                      histogram
//
// For the franz-go client's own metrics (bytes, requests, buffered records),
// add plugin/kprom to the processor with eos.ClientOptions(kgo.WithHooks(...)).
package eosprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eoskit/eoskit/eos"
)

// Metrics implements eos.Metrics with Prometheus collectors. One value may be
// shared by several processors in a process.
type Metrics struct {
	transactions *prometheus.CounterVec
	recordsIn    prometheus.Counter
	recordsOut   prometheus.Counter
	rebalances   prometheus.Counter
	fencings     prometheus.Counter
	hanging      *prometheus.CounterVec
	duration     *prometheus.HistogramVec
}

var (
	_ eos.Metrics        = (*Metrics)(nil)
	_ eos.HangingMetrics = (*Metrics)(nil)
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
// name when several processors share a registry. Default: none.
func ConstLabels(l prometheus.Labels) Option { return func(c *config) { c.labels = l } }

// DurationBuckets sets the histogram buckets of the transaction duration, in
// seconds. Default: 1ms to about 16s, doubling.
func DurationBuckets(b []float64) Option { return func(c *config) { c.buckets = b } }

// New creates the collectors and registers them with reg. It fails if reg
// already holds collectors of the same names and labels.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	c := config{namespace: "eoskit", buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}
	for _, o := range opts {
		o(&c)
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: c.namespace, Subsystem: "processor", Name: name, Help: help, ConstLabels: c.labels})
	}
	m := &Metrics{
		transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: c.namespace, Subsystem: "processor", Name: "transactions_total", ConstLabels: c.labels,
			Help: "Transactions (or batches, under the weaker semantics) ended, by outcome and abort reason.",
		}, []string{"outcome", "reason"}),
		recordsIn:  counter("records_in_total", "Input records of committed transactions."),
		recordsOut: counter("records_out_total", "Output records of committed transactions."),
		rebalances: counter("rebalances_total", "Times the group took partitions from a processor."),
		fencings:   counter("fencings_total", "Times a newer instance with the same transactional id fenced a processor."),
		hanging: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: c.namespace, Subsystem: "processor", Name: "hanging_transactions_total", ConstLabels: c.labels,
			Help: "Hanging transactions of a processor found in a partition, by the outcome their records elsewhere have (committed, aborted, unknown).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: c.namespace, Subsystem: "processor", Name: "transaction_duration_seconds", ConstLabels: c.labels,
			Help: "Time from the start of a transaction to its commit or abort.", Buckets: c.buckets,
		}, []string{"outcome"}),
	}
	for _, col := range []prometheus.Collector{m.transactions, m.recordsIn, m.recordsOut, m.rebalances, m.fencings, m.hanging, m.duration} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Committed implements eos.Metrics.
func (m *Metrics) Committed(recordsIn, recordsOut int, d time.Duration) {
	m.transactions.WithLabelValues("committed", "").Inc()
	m.recordsIn.Add(float64(recordsIn))
	m.recordsOut.Add(float64(recordsOut))
	m.duration.WithLabelValues("committed").Observe(d.Seconds())
}

// Aborted implements eos.Metrics.
func (m *Metrics) Aborted(reason string, d time.Duration) {
	m.transactions.WithLabelValues("aborted", reason).Inc()
	m.duration.WithLabelValues("aborted").Observe(d.Seconds())
}

// Rebalanced implements eos.Metrics.
func (m *Metrics) Rebalanced() { m.rebalances.Inc() }

// Fenced implements eos.Metrics.
func (m *Metrics) Fenced() { m.fencings.Inc() }

// HangingTransaction implements eos.HangingMetrics.
func (m *Metrics) HangingTransaction(outcome string) { m.hanging.WithLabelValues(outcome).Inc() }
