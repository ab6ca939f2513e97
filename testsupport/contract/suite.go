package contract

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
)

// Runner is a runner under the suite: eos.Processor, offsetstore.Runner,
// dedup.Consumer.
type Runner interface {
	Run(ctx context.Context) error
	Health() eoskit.Health
}

// World is one contract's input, runners and effects, over the bed of the
// runner's package (a real broker, and a database where the runner has
// one). Every runner a World builds consumes its input in one group.
type World interface {
	// Seed writes n records to the input, over several partitions, in
	// transactions of 50 that commit, each followed by one of 50 that
	// aborts (whose records no runner may apply), and returns the
	// committed records' ids in the order written. Ids are new to every
	// Seed of a World only where the runner skips an id it met
	// (dedup); elsewhere a second Seed repeats the first's.
	Seed(t *testing.T, n int) []string
	// Runner builds a runner whose handler calls s.Handle with each
	// record's id and offset and, unless it failed, writes the record's
	// effect (a row, an output record) in the runner's transaction.
	Runner(t *testing.T, s Setup) Runner
	// Effects returns the ids whose effects are committed, a duplicate
	// as often as it is committed.
	Effects(t *testing.T) []string
	// DeadLettered returns the ids dead-lettered (committed), a
	// duplicate as often as it is committed.
	DeadLettered(t *testing.T) []string
	// DeadLetterErrors returns, by id, the error text each dead letter
	// kept (the last, for an id dead-lettered twice).
	DeadLetterErrors(t *testing.T) map[string]string
	// Settled counts the effects and dead letters committed, cheaply
	// enough to poll.
	Settled(t *testing.T) int
	// DeadLetter is the runner's own dead-letter policy.
	DeadLetter() eoskit.ErrorPolicy
}

// Setup is what a contract asks of a runner.
type Setup struct {
	// Handle runs first for each record. A *DatabaseError asks the
	// runner's handler to fail its database transaction with that
	// SQLSTATE (a World with a database only).
	Handle func(ctx context.Context, id string, offset int64) error
	// Policy is the error policy; the zero value is eoskit.Stop, every
	// runner's default.
	Policy eoskit.ErrorPolicy
	// Drain is the DrainTimeout, when DrainSet.
	Drain    time.Duration
	DrainSet bool
	Metrics  eoskit.Metrics
	// Dial, when set, dials the runner's database connections (a World
	// with a database only): PoolWith makes such a pool.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// DatabaseError is what Setup.Handle returns to make the handler's
// database transaction fail with SQLSTATE Code.
type DatabaseError struct{ Code string }

func (e *DatabaseError) Error() string { return "contract: fail with SQLSTATE " + e.Code }

// DatabaseErrors are the SQLSTATE classes a handler's statement meets,
// and whose fault each is: a constraint or a malformed value is the
// record's (the error policy decides); a serialization failure, a
// deadlock, a lock or statement timeout, a server shutting down, a lost
// connection, exhausted resources are the database's (retried without
// blame, whatever the policy). The contract raises each code on a live
// connection (RAISE ... USING ERRCODE): it proves the decision by the
// database's word; the paths where the connection itself breaks (a
// server restarted, a backend terminated) are each runner's own tests,
// and so is 57014 from a COPY, which is the record's.
func DatabaseErrors() []struct {
	Code         string
	RecordsFault bool
} {
	return []struct {
		Code         string
		RecordsFault bool
	}{
		{"23505", true}, {"23503", true}, {"22P02", true},
		{"40001", false}, {"40P01", false}, {"55P03", false}, {"57014", false},
		{"57P01", false}, {"08006", false}, {"53300", false},
	}
}

// Features says what a runner's World can do beyond what every one does.
type Features struct {
	// Database: the World's handler writes in a database transaction,
	// which a *DatabaseError fails.
	Database bool
	// Batches: the handler takes a batch, and a failing record's
	// handler runs again in the halves of the batch that find it, so
	// the suite does not count its calls, and a record that fails once
	// is found and passes without the batch aborting.
	Batches bool
	// DeadLetteredOnce: a record the policy dead-letters is handled once,
	// even when other work aborted the transaction that dead-lettered it
	// (eos remembers it); elsewhere its handler runs again when the
	// batch does.
	DeadLetteredOnce bool
	// NoGroup: the runner reads no consumer group and runs no handler of
	// the user's (the outbox relay): only the lifecycle contract applies,
	// and its Health assigns no partitions.
	NoGroup bool
}

// Subject is a runner as its package's test gives it to the suite.
type Subject struct {
	Features Features
	// New makes a World for one contract: its own topics, group and
	// tables.
	New func(t *testing.T) World
}

// Run runs every contract against s: the error policy and its
// classification, the handler error shapes, the shutdown and the guard
// against a second Run, the drain, health, and metrics. Each is a parallel
// subtest.
func Run(t *testing.T, s Subject) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, Subject)
	}{
		{"policy", policy},
		{"retry", retry},
		{"shapes", shapes},
		{"database errors", databaseErrors},
		{"lifecycle", lifecycle},
		{"drain", drain},
		{"metrics", metrics},
		{"unconfirmed commit", unconfirmed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if s.Features.NoGroup && c.name != "lifecycle" {
				t.Skip("the runner runs no handler of the user's")
			}
			t.Parallel()
			c.run(t, s)
		})
	}
}

// patience bounds every wait of the suite.
const patience = 2 * time.Minute

// started is a Runner running in the background.
type started struct {
	r      Runner
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, r Runner) *started {
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(patience):
			t.Errorf("Run did not return within %s of its ctx's end", patience)
		}
	})
	return s
}

// wait returns what Run returned, failing the test past timeout.
func (s *started) wait(t *testing.T, timeout time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %s %s", timeout, what)
		return nil
	}
}

// stop cancels Run's ctx and fails the test unless Run returns nil.
func (s *started) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	if err := s.wait(t, patience, "after its ctx ended"); err != nil {
		t.Fatalf("Run returned %v after its ctx ended, want nil", err)
	}
}

// runUntil runs r until want effects and dead letters are committed, then
// stops it, failing the test unless Run returns nil.
func runUntil(t *testing.T, w World, r Runner, want int) {
	t.Helper()
	s := start(t, r)
	settle(t, w, s, want)
	s.stop(t)
}

// settle waits until want effects and dead letters are committed, failing
// the test when Run returns first or past patience.
func settle(t *testing.T, w World, s *started, want int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for w.Settled(t) < want {
		select {
		case err := <-s.done:
			s.done <- err // for the cleanup
			t.Fatalf("Run returned %v with %d of %d records settled", err, w.Settled(t), want)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records settled within %s", w.Settled(t), want, patience)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exactly fails the test unless got holds what want holds, each as often.
func exactly(t *testing.T, what string, got, want []string) {
	t.Helper()
	count := map[string]int{}
	for _, id := range want {
		count[id]++
	}
	for _, id := range got {
		count[id]--
	}
	var missing, over []string
	for id, c := range count {
		switch {
		case c > 0:
			missing = append(missing, id)
		case c < 0:
			over = append(over, id)
		}
	}
	if len(missing)+len(over) > 0 {
		sort.Strings(missing)
		sort.Strings(over)
		t.Fatalf("%s: %d, want %d: missing %v, more often than expected (duplicated, or not expected at all) %v", what, len(got), len(want), head(missing), head(over))
	}
}

func head(ids []string) []string { return ids[:min(len(ids), 10)] }

var errParse = errors.New("cannot parse the record")

type timeoutError struct{ op string }

func (e *timeoutError) Error() string { return e.op + ": timed out" }

// policy: a classified policy. A record that cannot be parsed is
// dead-lettered at once, one that times out twice is retried and then
// applied, one that fails as the store does for no record's fault (where
// the World can) is retried by the runner without blame though the
// policy's fallback is Stop, and a record failing otherwise stops Run with
// a *eoskit.RecordError naming it after one attempt. The runner run again
// with that record mended, every record is applied once or dead-lettered
// once; under DeadLetteredOnce a dead-lettered record's handler ran once,
// whatever else aborted its work.
func policy(t *testing.T, s Subject) {
	const n, stopAt = 300, 260
	w := s.New(t)
	ids := w.Seed(t, n)
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	var mu sync.Mutex
	calls := map[string]int{}
	mended := false
	var stopOffset atomic.Int64
	stopOffset.Store(-1)
	handle := func(_ context.Context, id string, off int64) error {
		mu.Lock()
		calls[id]++
		c, fixed := calls[id], mended
		mu.Unlock()
		switch i := index[id]; {
		case i == stopAt && !fixed:
			stopOffset.Store(off)
			return errors.New("the disk is full: " + id)
		case i%50 == 13:
			return fmt.Errorf("record %s: %w", id, errParse)
		case i%50 == 27 && c <= 2:
			return fmt.Errorf("calling the pricing service: %w", &timeoutError{op: "price " + id})
		case i%50 == 41 && c == 1 && s.Features.Database:
			return &DatabaseError{Code: "40001"}
		}
		return nil
	}
	p := eoskit.Classify(eoskit.Stop(),
		eoskit.When(errParse, w.DeadLetter()),
		eoskit.WhenAs[*timeoutError](eoskit.Retry(time.Millisecond, 5)),
	)
	runner := w.Runner(t, Setup{Handle: handle, Policy: p})
	err := start(t, runner).wait(t, patience, "on the record that fails otherwise")
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != stopOffset.Load() || rerr.Attempts != 1 || rerr.Err.Error() != "the disk is full: "+ids[stopAt] {
		t.Fatalf("Run = %v; want a *RecordError naming %s, at offset %d, after 1 attempt", err, ids[stopAt], stopOffset.Load())
	}
	mu.Lock()
	mended = true
	mu.Unlock()
	var good, parsed []string
	for i, id := range ids {
		if i%50 == 13 {
			parsed = append(parsed, id)
		} else {
			good = append(good, id)
		}
	}
	// The same runner runs again, as a supervisor calls Run again once
	// the record is mended.
	runUntil(t, w, runner, n)
	exactly(t, "records applied", w.Effects(t), good)
	exactly(t, "records dead-lettered", w.DeadLettered(t), parsed)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range parsed {
		if calls[id] != 1 && s.Features.DeadLetteredOnce {
			t.Errorf("%s (cannot be parsed): its handler ran %d times; want once, no retry, whatever else aborted its work", id, calls[id])
		}
	}
}

// retry: under Retry(attempts 3), a record that keeps failing is tried 3
// times and then goes to the fallback, dead-lettered once or stopping Run
// with a *eoskit.RecordError naming it after 3 attempts; a record that
// fails twice is applied once.
func retry(t *testing.T, s Subject) {
	for _, fallback := range []string{"dead letter", "stop"} {
		t.Run(fallback, func(t *testing.T) {
			t.Parallel()
			const n = 300
			w := s.New(t)
			ids := w.Seed(t, n)
			var mu sync.Mutex
			calls := map[string]int{}
			var good, bad []string
			for _, id := range ids {
				if strings.HasSuffix(id, "77") {
					bad = append(bad, id)
				} else {
					good = append(good, id)
				}
			}
			handle := func(_ context.Context, id string, _ int64) error {
				mu.Lock()
				defer mu.Unlock()
				calls[id]++
				switch {
				case strings.HasSuffix(id, "77"):
					return errors.New("poison " + id)
				case strings.HasSuffix(id, "5") && calls[id] <= 2:
					return errors.New("flaky " + id)
				}
				return nil
			}
			p := eoskit.Retry(time.Millisecond, 3)
			if fallback == "stop" {
				err := start(t, w.Runner(t, Setup{Handle: handle, Policy: p})).wait(t, patience, "on a record that always fails")
				var rerr *eoskit.RecordError
				if !errors.As(err, &rerr) {
					t.Fatalf("Run = %v, want a *RecordError for a record that always fails, after 3 attempts", err)
				}
				named, _ := strings.CutPrefix(fmt.Sprint(rerr.Err), "poison ")
				if rerr.Attempts != 3 || !slices.Contains(bad, named) {
					t.Fatalf("Run = %v, want a *RecordError for a record that always fails, after 3 attempts", err)
				}
				return
			}
			runUntil(t, w, w.Runner(t, Setup{Handle: handle, Policy: p.Then(w.DeadLetter())}), n)
			exactly(t, "records applied", w.Effects(t), good)
			exactly(t, "records dead-lettered", w.DeadLettered(t), bad)
			mu.Lock()
			defer mu.Unlock()
			for _, id := range bad {
				if calls[id] != 3 && !s.Features.Batches {
					t.Errorf("%s always fails: its handler ran %d times, want 3 (the Retry's attempts)", id, calls[id])
				}
			}
		})
	}
}

// shapes: the handler error shapes the world makes (Shapes) each go to the
// rule the policy gives them: the record dead-lettered in the work that
// commits its offset, every other record applied once.
func shapes(t *testing.T, s Subject) {
	for _, shape := range Shapes() {
		t.Run(shape.Name, func(t *testing.T) {
			t.Parallel()
			const n = 300
			w := s.New(t)
			ids := w.Seed(t, n)
			bad := map[string]bool{}
			var good, dead []string
			for i, id := range ids {
				if i%40 == 7 {
					bad[id] = true
					dead = append(dead, id)
				} else {
					good = append(good, id)
				}
			}
			var mu sync.Mutex
			offsets := map[string]int64{}
			handle := func(_ context.Context, id string, off int64) error {
				if bad[id] {
					mu.Lock()
					offsets[id] = off
					mu.Unlock()
				}
				switch {
				case bad[id] && shape.Panics:
					panic(shape.Err(off))
				case bad[id]:
					return shape.Err(off)
				}
				return nil
			}
			runUntil(t, w, w.Runner(t, Setup{Handle: handle, Policy: Policy(w.DeadLetter())}), n)
			exactly(t, "records applied", w.Effects(t), good)
			exactly(t, "records dead-lettered", w.DeadLettered(t), dead)
			// Each dead letter keeps its own cause, as the handler gave
			// it, offset and all.
			kept := w.DeadLetterErrors(t)
			for _, id := range dead {
				mu.Lock()
				off := offsets[id]
				mu.Unlock()
				for _, want := range append([]string{shape.Err(off).Error()}, shape.Kept...) {
					if !strings.Contains(kept[id], want) {
						t.Fatalf("the dead letter of %s kept the error %q, which does not say %q", id, kept[id], want)
					}
				}
			}
		})
	}
}

// databaseErrors: each SQLSTATE class of DatabaseErrors gets its fate
// under a DeadLetter policy. A record whose statement the database
// refuses for its own sake (a constraint, a malformed value) is
// dead-lettered; one whose statement failed for the database's sake
// (failing once) is retried without blame and applied, nothing
// dead-lettered. Every other record is applied once either way.
func databaseErrors(t *testing.T, s Subject) {
	if !s.Features.Database {
		t.Skip("the runner writes in no database")
	}
	for _, c := range DatabaseErrors() {
		t.Run(c.Code, func(t *testing.T) {
			t.Parallel()
			const n = 200
			w := s.New(t)
			ids := w.Seed(t, n)
			var mu sync.Mutex
			calls := map[string]int{}
			var good, dead []string
			for i, id := range ids {
				if i%40 == 9 && c.RecordsFault {
					dead = append(dead, id)
				} else {
					good = append(good, id)
				}
			}
			handle := func(_ context.Context, id string, _ int64) error {
				mu.Lock()
				defer mu.Unlock()
				calls[id]++
				if i := slices.Index(ids, id); i%40 == 9 && (c.RecordsFault || calls[id] == 1) {
					return &DatabaseError{Code: c.Code}
				}
				return nil
			}
			runUntil(t, w, w.Runner(t, Setup{Handle: handle, Policy: w.DeadLetter()}), n)
			exactly(t, "records applied", w.Effects(t), good)
			exactly(t, "records dead-lettered", w.DeadLettered(t), dead)
		})
	}
}

// lifecycle: Health before, during and after Run; a second Run while one
// runs is refused with eoskit.ErrRunning at once; Run returns nil when its
// ctx ends; the same runner runs again and goes on where it stopped, each
// record applied once.
func lifecycle(t *testing.T, s Subject) {
	const n = 200
	w := s.New(t)
	ids := w.Seed(t, n)
	r := w.Runner(t, Setup{})
	if h := r.Health(); h.Running || h.Ready() {
		t.Fatalf("before Run: Health %+v, want neither running nor ready", h)
	}
	first := start(t, r)
	settle(t, w, first, n)
	deadline := time.Now().Add(patience)
	for !r.Health().Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("all records applied, yet not Ready within %s: %+v", patience, r.Health())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if h := r.Health(); !h.Healthy() || len(h.Assigned) == 0 && !s.Features.NoGroup || h.LastCommit.IsZero() {
		t.Errorf("while running: Health %+v, want healthy, assigned, committed", h)
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := r.Run(ctx); !errors.Is(err, eoskit.ErrRunning) || time.Since(began) > 5*time.Second {
		t.Errorf("a second Run returned %v after %s, want eoskit.ErrRunning at once", err, time.Since(began))
	}
	first.stop(t)
	if h := r.Health(); h.Running || h.Ready() || h.LastError != "" && h.LastErrorAt.After(h.LastCommit) {
		t.Errorf("after Run returned: Health %+v, want not running, not ready, and no error after its last commit", h)
	}
	more := w.Seed(t, n)
	runUntil(t, w, r, 2*n)
	exactly(t, "records applied over two Runs of one runner", w.Effects(t), append(ids, more...))
}

// drain: when Run's ctx ends, the handler under way finishes and its work
// commits before Run returns nil (DrainTimeout), with the work of every
// handler that returned; with DrainTimeout(0) it is rolled back instead
// (the negative control). Either way a successor
// applies the rest, each record once.
func drain(t *testing.T, s Subject) {
	for _, d := range []time.Duration{10 * time.Second, 0} {
		t.Run(fmt.Sprintf("timeout %s", d), func(t *testing.T) {
			t.Parallel()
			const n = 200
			w := s.New(t)
			ids := w.Seed(t, n)
			slow := ids[n/2]
			entered := make(chan struct{})
			var once sync.Once
			var mu sync.Mutex
			handled := map[string]bool{} // handlers that returned
			handle := func(ctx context.Context, id string, _ int64) error {
				if id == slow {
					once.Do(func() { close(entered) })
					// Deaf to ctx for a while: work that must run to
					// its end.
					time.Sleep(time.Second)
				}
				mu.Lock()
				handled[id] = true
				mu.Unlock()
				return nil
			}
			r := start(t, w.Runner(t, Setup{Handle: handle, Drain: d, DrainSet: true}))
			select {
			case <-entered:
			case <-time.After(patience):
				t.Fatalf("the handler did not reach %s within %s", slow, patience)
			}
			r.stop(t)
			effects := w.Effects(t)
			applied := slices.Contains(effects, slow)
			switch {
			case d > 0 && !applied:
				t.Fatalf("after a drained shutdown %s, whose handler was under way, is not committed", slow)
			case d == 0 && applied:
				t.Fatalf("without a drain %s, whose handler was under way, is committed; want its work rolled back", slow)
			}
			if d > 0 {
				// Every handler that returned had its work committed by
				// the time Run returned.
				mu.Lock()
				for id := range handled {
					if !slices.Contains(effects, id) {
						t.Errorf("after a drained shutdown %s, whose handler returned, is not committed", id)
					}
				}
				mu.Unlock()
			}
			runUntil(t, w, w.Runner(t, Setup{}), n)
			exactly(t, "records applied", w.Effects(t), ids)
		})
	}
}

// Recorder is an eoskit.Metrics that keeps what a runner reports.
type Recorder struct {
	eoskit.NopMetrics
	mu           sync.Mutex
	in           int
	deadLettered int
	aborted      map[string]int
}

func (m *Recorder) Committed(in, _ int, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.in += in
}

func (m *Recorder) DeadLettered(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deadLettered += n
}

func (m *Recorder) Aborted(reason string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aborted == nil {
		m.aborted = map[string]int{}
	}
	m.aborted[reason]++
}

func (m *Recorder) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprintf("in %d, dead-lettered %d, aborted %v", m.in, m.deadLettered, m.aborted)
}

// metrics: what a runner reports adds up to what it did. The records in
// of committed work count each record once (aborted work counts none),
// dead letters count each dead-lettered record once, and a record
// retried aborts work with reason "handler-error" (a batch runner finds a
// record that fails once and passes it without aborting).
func metrics(t *testing.T, s Subject) {
	const n = 300
	w := s.New(t)
	ids := w.Seed(t, n)
	var mu sync.Mutex
	calls := map[string]int{}
	handle := func(_ context.Context, id string, _ int64) error {
		mu.Lock()
		defer mu.Unlock()
		calls[id]++
		switch i := slices.Index(ids, id); {
		case i%60 == 11:
			return errParse
		case i%60 == 31 && calls[id] == 1:
			return &timeoutError{op: id}
		}
		return nil
	}
	var dead int
	for i := range ids {
		if i%60 == 11 {
			dead++
		}
	}
	m := &Recorder{}
	p := eoskit.Classify(eoskit.Stop(), eoskit.When(errParse, w.DeadLetter()), eoskit.WhenAs[*timeoutError](eoskit.Retry(time.Millisecond, 3)))
	runUntil(t, w, w.Runner(t, Setup{Handle: handle, Policy: p, Metrics: m}), n)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.in != n || m.deadLettered != dead || m.aborted["handler-error"] == 0 && !s.Features.Batches {
		t.Fatalf("reported %s; want in %d, dead-lettered %d, and work aborted for a handler error", strings.TrimSpace(fmt.Sprintf("in %d, dead-lettered %d, aborted %v", m.in, m.deadLettered, m.aborted)), n, dead)
	}
}
