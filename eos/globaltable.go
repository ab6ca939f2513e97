package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/topiccheck"
	"github.com/eoskit/eoskit/state"
)

// GlobalTable is every partition of a small compacted topic, held in
// memory on every instance for lookups (region code → region name), as
// Kafka Streams' GlobalKTable: a processor given it ([WithGlobalTables])
// restores it whole, read_committed, before its first record is handled,
// and keeps it current while it runs. Safe for concurrent use (handlers,
// HTTP handlers).
//
// What holds: a lookup sees the table's committed records only, never
// one of an aborted transaction; each key's latest committed value (a
// nil value deletes it) as of the last refresh. What it does not give: a
// lookup is not synchronized with the stream's time or offsets: a record
// handled again after a restart may see a newer value than the first
// time (Kafka Streams' global tables behave the same). A table updated in
// the same transaction as a stream's records is no join; see issue 45's
// co-partitioned tables for that. Partitions added to the topic after Run
// started are not read.
type GlobalTable struct {
	tableSettings

	inUse atomic.Bool
	mu    sync.RWMutex
	parts []*state.Memory // by partition; nil until restored
	// refreshed is when the last refresh that caught up every partition
	// started: what was committed before then is in the table.
	refreshed atomic.Int64
	// failing is the last refresh's error text ("" when it caught up),
	// so that a failure is logged when it starts or changes, not on
	// every refresh. Only the refresh's goroutine uses it.
	failing string
}

// TableOption configures a [GlobalTable] or a co-partitioned [Table].
type TableOption interface{ applyTable(*tableSettings) }

// tableSettings is what the table options set.
type tableSettings struct {
	topic      string
	refresh    time.Duration
	refreshSet bool // RefreshInterval given (a Table refuses it)
	timeout    time.Duration
}

type tableOpt func(*tableSettings)

func (o tableOpt) applyTable(t *tableSettings) { o(t) }

// RefreshInterval sets how often a running processor reads what was
// committed to a global table's topic since (default 1 s). A
// co-partitioned [Table] follows its topic as it runs and refuses it.
func RefreshInterval(d time.Duration) TableOption {
	return tableOpt(func(t *tableSettings) { t.refresh, t.refreshSet = d, true })
}

// TableRestoreTimeout bounds how long the table's restore (at Run, or a
// refresh) may go without progress (default 5 minutes; a transaction
// left open on the topic holds it until the broker aborts it). For a
// co-partitioned [Table], it bounds how long a record waits for table
// records known to be committed but not fetched yet.
func TableRestoreTimeout(d time.Duration) TableOption {
	return tableOpt(func(t *tableSettings) { t.timeout = d })
}

func newTableSettings(topic string, opts []TableOption) tableSettings {
	s := tableSettings{topic: topic, refresh: time.Second, timeout: changelog.DefaultTimeout}
	for _, o := range opts {
		o.applyTable(&s)
	}
	return s
}

// NewGlobalTable returns the table of topic, empty until a processor's Run
// restored it.
func NewGlobalTable(topic string, opts ...TableOption) *GlobalTable {
	return &GlobalTable{tableSettings: newTableSettings(topic, opts)}
}

// ErrTableNotRestored is returned by [GlobalTable.Get] before a Run
// restored the table.
var ErrTableNotRestored = errors.New("eos: the global table is not restored yet")

// Topic returns the table's topic.
func (t *GlobalTable) Topic() string { return t.topic }

// Get returns key's latest committed value, and whether it has one. A
// key is looked up in every partition (the table's producer chose one).
func (t *GlobalTable) Get(key []byte) ([]byte, bool, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.parts == nil {
		return nil, false, ErrTableNotRestored
	}
	for _, s := range t.parts {
		v, ok, err := s.Get(key)
		if err != nil || ok {
			return v, ok, err
		}
	}
	return nil, false, nil
}

// Refreshed returns when the last refresh that caught up with the whole
// topic started: every record committed before then is in the table (the
// zero time before its restore). Lookups are as stale as now less this.
func (t *GlobalTable) Refreshed() time.Time {
	if ns := t.refreshed.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// WithGlobalTables gives a processor tables to restore before its first
// record and keep current (see [GlobalTable]). A table missing is a
// *[eoskit.ConfigError] from Run; a table given to two processors running
// at once is refused by the second's Run. The processor needs Describe
// and Read on each table's topic.
func WithGlobalTables(tables ...*GlobalTable) ProcessorOption {
	return processorOpt(func(c *config) { c.tables = append(c.tables, tables...) })
}

// validateTables checks the tables' settings.
func validateTables(c *config) error {
	for i, t := range c.tables {
		refuse := func(reason string) error {
			return &eoskit.ConfigError{Package: "eos", Setting: "WithGlobalTables", Semantics: checkedAgainst(c.semantics), Reason: reason}
		}
		switch {
		case t == nil:
			return refuse("a nil table")
		case t.topic == "":
			return refuse("a table without a topic")
		case t.refresh <= 0 || t.timeout <= 0:
			return refuse(fmt.Sprintf("table %q: its refresh interval and restore timeout must be positive", t.topic))
		case slices.Contains(c.inputTopics, t.topic):
			return refuse(fmt.Sprintf("table %q is also an input topic", t.topic))
		case slices.Contains(c.tables[i+1:], t):
			return refuse(fmt.Sprintf("table %q is given twice", t.topic))
		}
	}
	return nil
}

// restoreTables restores every table before the first session, and keeps
// them current until stop is called (when Run returns).
func (p *Processor) restoreTables(ctx context.Context) (stop func(), err error) {
	if len(p.cfg.tables) == 0 {
		return func() {}, nil
	}
	var taken []*GlobalTable
	release := func() {
		for _, t := range taken {
			t.inUse.Store(false)
		}
	}
	for _, t := range p.cfg.tables {
		if !t.inUse.CompareAndSwap(false, true) {
			release()
			return nil, &eoskit.ConfigError{Package: "eos", Setting: "WithGlobalTables", Semantics: checkedAgainst(p.cfg.semantics),
				Reason: fmt.Sprintf("table %q is in use by another processor's Run", t.topic)}
		}
		taken = append(taken, t)
	}
	r, err := changelog.NewRestorer(p.cfg.connOpts())
	if err != nil {
		release()
		return nil, err
	}
	for _, t := range p.cfg.tables {
		if err := p.restoreTable(ctx, r, t); err != nil {
			r.Close()
			release()
			return nil, err
		}
	}
	followCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The restorer's Warn lines (a table wiped: its topic created
		// again) matter; its line per restore would drown the log.
		quiet := slog.New(warnOnly{p.logger.Handler()})
		due := make([]time.Time, len(p.cfg.tables))
		for i, t := range p.cfg.tables {
			due[i] = time.Now().Add(t.refresh)
		}
		for loop.Sleep(followCtx, time.Until(slices.MinFunc(due, time.Time.Compare))) {
			for i, t := range p.cfg.tables {
				if time.Now().Before(due[i]) {
					continue
				}
				t.refreshOnce(followCtx, r, quiet, p.logger)
				due[i] = time.Now().Add(t.refresh)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		r.Close()
		release()
	}, nil
}

// restoreTable checks that t's topic exists and restores its partitions.
func (p *Processor) restoreTable(ctx context.Context, r *changelog.Restorer, t *GlobalTable) error {
	tds, err := topiccheck.Describe(ctx, p.cfg.connOpts(), t.topic)
	if err != nil {
		return fmt.Errorf("eos: describe the global table %q: %w", t.topic, err)
	}
	td, ok := tds[t.topic]
	switch {
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return &eoskit.ConfigError{Package: "eos", Setting: "WithGlobalTables", Semantics: checkedAgainst(p.cfg.semantics),
			Reason: fmt.Sprintf("the global table's topic %q does not exist", t.topic)}
	case errors.Is(td.Err, kerr.TopicAuthorizationFailed):
		return &eoskit.AuthorizationError{Permission: fmt.Sprintf("Describe and Read on the global table's topic %q", t.topic), Err: td.Err}
	case td.Err != nil:
		return fmt.Errorf("eos: describe the global table %q: %w", t.topic, td.Err)
	}
	// A table a former Run restored catches up where it is, answering
	// from what it held meanwhile; a new one (or one whose partition
	// count changed) is restored aside and shown once whole.
	t.mu.RLock()
	parts := t.parts
	t.mu.RUnlock()
	if len(parts) != len(td.Partitions) {
		parts = make([]*state.Memory, len(td.Partitions))
		for i := range parts {
			parts[i] = state.NewMemory()
		}
	}
	start := time.Now()
	if err := t.catchUp(ctx, r, parts, p.logger); err != nil {
		return fmt.Errorf("eos: restore the global table %q: %w", t.topic, err)
	}
	t.mu.Lock()
	t.parts = parts
	t.mu.Unlock()
	t.refreshed.Store(start.UnixNano())
	p.logger.Info("eos: global table restored", "topic", t.topic, "partitions", len(parts), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// refreshOnce reads what was committed to t's topic since its last
// refresh, logging a failure when it starts or changes, and when it ends.
func (t *GlobalTable) refreshOnce(ctx context.Context, r *changelog.Restorer, quiet, logger *slog.Logger) {
	start := time.Now()
	t.mu.RLock()
	parts := t.parts
	t.mu.RUnlock()
	err := t.catchUp(ctx, r, parts, quiet)
	switch {
	case ctx.Err() != nil:
	case err == nil:
		t.refreshed.Store(start.UnixNano())
		if t.failing != "" {
			logger.Info("eos: a global table's refresh caught up again", "topic", t.topic)
		}
		t.failing = ""
	case err.Error() != t.failing:
		t.failing = err.Error()
		logger.Warn("eos: a global table's refresh failed; lookups answer from what it holds (see Refreshed)", "topic", t.topic, "err", err)
	}
}

// catchUp reads each partition of t into parts from where it is to the
// committed end, going on past a partition that fails.
func (t *GlobalTable) catchUp(ctx context.Context, r *changelog.Restorer, parts []*state.Memory, logger *slog.Logger) error {
	var errs []error
	for i, s := range parts {
		if _, err := r.Restore(ctx, t.topic, int32(i), s, changelog.Options{Timeout: t.timeout, Logger: logger}); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// warnOnly passes on what its handler takes at Warn and above.
type warnOnly struct{ slog.Handler }

func (w warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}
