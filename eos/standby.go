package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/state"
)

// Standbys keeps each partition's state warm on n instances besides its
// owner, as Kafka Streams' num.standby.replicas: each follows the
// changelog partitions it is standby for, read_committed, into stores of
// its own (the processor's [Stores]: a pebble standby keeps its
// checkpoint too), catching up every second; when the group gives it one
// of them, its restore reads only the tail since its last catch-up. A
// standby never serves writes, nor reads as current: [StateView] shows
// only the partitions an instance owns, and a standby's values only
// when asked for stale ones ([StateView.StandbyLookup],
// [StateView.StandbyScan]).
//
// Placement: under the classic protocol with franz-go's default balancer
// (cooperative-sticky, left unset), the group balances with
// eoskit-standby-v2, whose leader places the standbys with the
// partitions and writes each member's into its assignment (every member
// reads its own from the group's description): an owner's partitions
// keep theirs on different members, as evenly as the members allow, and
// a member already warm on a partition keeps it wherever that spread
// allows. The same balance knows what each member holds warm (its
// standbys, and the stores of partitions taken away it still keeps), and
// puts a partition whose owner left on one of those wherever the balance
// allows: when an owner leaves, each of its partitions lands on its
// standby. Under another balancer or KIP-848 (where the coordinator
// assigns), the standbys are placed by a ring instead: the members that
// advertise an [Endpoint] (which Standbys needs), in the order of their
// endpoints, partition p's first standby the member 1+p%(m-1) places
// after its owner, m the members, wrapping around; and a moved partition
// goes where the balancer puts it, meeting a warm store only if it lands
// on one. Either way a standby moves when its partition's owner, or the
// membership, changes. An explicit
// kgo.Balancers(kgo.CooperativeStickyBalancer()) cannot be told from the
// default and is replaced too; give any other balancer to keep your own. What it costs:
// each standby reads its partitions' changelog as the owner writes it (a
// catch-up a second, a few admin requests each), and holds their state
// (memory, or disk with pebble) beside its own. Default 0.
func Standbys(n int) StateOption {
	return stateOpt(func(c *stateConfig) { c.standbys = n })
}

// standbyEvery is how often an instance looks at the group and catches
// its standby stores up.
const standbyEvery = time.Second

// standbyPartitions returns the partitions self keeps warm: partition
// p's n standbys are the members 1+(p+j)%(m-1) places after its owner in
// members' order (sorted, wrapping around), j < n, m the members. By the
// partition's number, so that a standby moves only when its partition's
// owner or the membership changes, not as the owner's other partitions
// come and go; an owner's partitions of different numbers spread their
// standbys over the other members, where a balance of the group can put
// them when it leaves (standbyBalancer).
func standbyPartitions(owners map[int32]string, members []string, self string, n int) []int32 {
	at := slices.Index(members, self)
	others := len(members) - 1
	if at < 0 || n <= 0 || others <= 0 {
		return nil
	}
	var out []int32
	for p, owner := range owners {
		o := slices.Index(members, owner)
		if o < 0 || o == at {
			continue
		}
		k := (at - o + len(members)) % len(members) // self is the k-th member after the owner
		for j := range min(n, others) {
			if 1+(int(p)+j)%others == k {
				out = append(out, p)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// standby is a store kept warm for a partition another member owns. Its
// turn is held while it opens, while each of its catch-up's writes
// applies (followed), while a stale read reads it (StandbyLookup), while
// it is closed, and by prepare taking it over, which first cancels the
// catch-up under way (cancel, set under ks.mu); not while a catch-up
// fetches.
type standby struct {
	turn   chan struct{} // a lock a reader can stop waiting for
	store  state.Store   // nil while it opens, or when its opening failed
	cancel context.CancelFunc
	// gone: taken over or closed (turn held): a catch-up's late write
	// must not touch it.
	gone bool
	// caught: a catch-up of it succeeded (or it was this instance's own
	// store), so the group may be told it is warm (ks.mu).
	caught bool
	// caughtAt: when its last successful catch-up started (what it read
	// was committed by then; ks.mu); zero before the first, for a store
	// this instance kept of its own until its first (it lags behind the
	// new owner by an unknown time), and once a catch-up wiped it.
	caughtAt time.Time
}

// errStandbyGone is a catch-up's write to a standby taken over or
// closed meanwhile: a closed store to the restorer, which gives up.
var errStandbyGone = fmt.Errorf("eos: the standby was taken over or closed: %w", state.ErrClosed)

// followed is a standby's store as its catch-up writes it: each write
// holds the standby's turn (a stale read waits for one write, not for
// the fetches between), and fails once the standby is gone; a wipe
// (Reset) makes it unreadable as stale until a catch-up succeeds.
type followed struct {
	state.Store
	sb   *standby
	ks   *keyedState
	part int32
}

func (f followed) Apply(ws []state.Write, cp state.Checkpoint) error {
	f.sb.lock()
	defer f.sb.unlock()
	if f.sb.gone {
		return errStandbyGone
	}
	return f.Store.Apply(ws, cp)
}

func (f followed) Reset(cp state.Checkpoint) error {
	f.sb.lock()
	defer f.sb.unlock()
	if f.sb.gone {
		return errStandbyGone
	}
	// Wiped: neither readable as stale nor warm until caught up again.
	f.ks.mu.Lock()
	f.sb.caughtAt, f.sb.caught = time.Time{}, false
	if f.ks.standbys[f.part] == f.sb {
		f.ks.noteWarmLocked()
	}
	f.ks.mu.Unlock()
	return f.Store.Reset(cp)
}

// Close is not the catch-up's to do: the standby's owner closes it.
func (followed) Close() error { return nil }

// dropStandby closes part's standby sb, once no read nor write is under
// way (ks.mu not held: a stale read holds the turn, then ks.mu), unless a
// restore took it over first: it stays in ks.standbys until its store
// is closed, so that a
// restore assigned meanwhile either takes it (takeStandby) or finds it
// gone, closed, and opens the store afresh (never beside it: pebble
// locks its directory).
func (ks *keyedState) dropStandby(part int32, sb *standby) {
	sb.lock()
	defer sb.unlock()
	ks.mu.RLock()
	current := ks.standbys[part] == sb
	ks.mu.RUnlock()
	if !current {
		return // taken over while this waited: the restore's now
	}
	sb.gone = true
	if sb.store != nil {
		_ = sb.store.Close()
	}
	ks.mu.Lock()
	if ks.standbys[part] == sb {
		delete(ks.standbys, part)
		ks.noteWarmLocked()
	}
	ks.mu.Unlock()
}

func newStandby(s state.Store, caught bool) *standby {
	return &standby{turn: make(chan struct{}, 1), store: s, caught: caught}
}

func (sb *standby) lock()   { sb.turn <- struct{}{} }
func (sb *standby) unlock() { <-sb.turn }

// lockCtx is lock, given up when ctx ends first (a catch-up can hang on
// brokers that do not answer).
func (sb *standby) lockCtx(ctx context.Context) error {
	select {
	case sb.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// followStandbys keeps the standby stores current until stop is called
// (when Run returns); nothing without Standbys.
func (p *Processor) followStandbys(ctx context.Context) (stop func(), err error) {
	ks := p.state
	if ks == nil || ks.cfg.standbys <= 0 {
		return func() {}, nil
	}
	r, err := changelog.NewRestorer(p.cfg.connOpts())
	if err != nil {
		return nil, fmt.Errorf("eos: standby restorer: %w", err)
	}
	followCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	quiet := slog.New(warnOnly{p.logger.Handler()})
	go func() {
		defer close(done)
		failing := ""
		for loop.Sleep(followCtx, standbyEvery) {
			err := ks.followStandbysOnce(followCtx, r, p.cfg.endpoint, quiet)
			switch {
			case followCtx.Err() != nil:
				// Stopping: neither a failure nor a recovery.
			case err != nil && err.Error() != failing:
				failing = err.Error()
				p.logger.Warn("eos: standbys are not placed: the group cannot be described (Describe on the group?)", "err", err)
			case err == nil && failing != "":
				failing = ""
				p.logger.Info("eos: standbys are placed again")
			}
		}
	}()
	return func() {
		cancel()
		<-done
		r.Close()
		ks.mu.RLock()
		closing := maps.Clone(ks.standbys)
		ks.mu.RUnlock()
		// A stale read holds a standby's turn, then ks.mu: its turn is
		// waited for with ks.mu free.
		for part, sb := range closing {
			ks.dropStandby(part, sb)
		}
	}, nil
}

// followStandbysOnce places this instance's standbys from the group's
// description, opens the stores of the partitions it newly keeps, closes
// those it no longer keeps, and catches each up with the changelog.
func (ks *keyedState) followStandbysOnce(ctx context.Context, r *changelog.Restorer, self string, logger *slog.Logger) error {
	view, err := ks.owners.snapshot(ctx)
	if err != nil {
		return err // ctx's, when stopping: followStandbys logs nothing then
	}
	owners := view.byPart
	if !slices.Contains(view.members, self) {
		// Without this instance (a session restart left the group for
		// a moment): keep what is kept, and look again next time.
		return nil
	}
	// The leader's placement (standbyBalancer), else the ring's.
	want, planned := view.planned[self]
	if !planned {
		want = standbyPartitions(owners, view.members, self, ks.cfg.standbys)
	}
	drop := map[int32]*standby{}
	ks.mu.Lock()
	ks.marksMu.Lock()
	busy := func(part int32) bool { // this instance owns it, or is about to
		_, held := ks.parts[part]
		return held || ks.restoring[part] || ks.restore[part]
	}
	for part, sb := range ks.standbys {
		// A partition nobody holds (a rebalance under way: maybe this
		// instance's next) keeps its standby; one another member holds
		// without this one among its standbys loses it.
		if owner := owners[part]; owner != "" && owner != self && !slices.Contains(want, part) && !busy(part) {
			drop[part] = sb
		}
	}
	var open []int32
	for _, part := range want {
		pk, parked := ks.parked[part]
		_, kept := ks.standbys[part]
		switch {
		case parked && !kept && !busy(part):
			// Taken away from this instance, which now keeps it warm:
			// its store goes on from its checkpoint (its tables are
			// not followed any more).
			delete(ks.parked, part)
			ks.standbys[part] = newStandby(pk.store, true)
			ks.tablesClosed(part)
		case !parked && !kept && !busy(part):
			open = append(open, part)
		}
	}
	ks.noteWarmLocked()
	ks.marksMu.Unlock()
	ks.mu.Unlock()
	// No catch-up runs now (they run on this goroutine); a stale read or
	// a takeover under way is waited for.
	for part, sb := range drop {
		ks.dropStandby(part, sb)
	}
	for _, part := range open {
		if ctx.Err() != nil {
			return nil
		}
		// Reserved before it opens, its turn held: a restore assigned
		// meanwhile takes it (takeStandby waits for the opening) rather
		// than open the same store beside it (pebble locks its
		// directory).
		ks.mu.Lock()
		ks.marksMu.Lock()
		_, parked := ks.parked[part]
		_, kept := ks.standbys[part]
		reserved := !parked && !kept && !busy(part)
		var sb *standby
		if reserved {
			sb = newStandby(nil, false)
			sb.lock()
			ks.standbys[part] = sb
		}
		ks.marksMu.Unlock()
		ks.mu.Unlock()
		if !reserved {
			continue
		}
		s, err := ks.cfg.stores(ks.cfg.changelog, part)
		if err != nil {
			logger.Warn("eos: opening a standby store failed", "partition", part, "err", err)
			ks.mu.Lock()
			if ks.standbys[part] == sb {
				delete(ks.standbys, part)
			}
			ks.mu.Unlock()
			sb.gone = true
			sb.unlock()
			continue
		}
		sb.store = s
		sb.unlock()
	}
	ks.mu.RLock()
	kept := make(map[int32]*standby, len(ks.standbys))
	for part, sb := range ks.standbys {
		kept[part] = sb
	}
	ks.mu.RUnlock()
	for part, sb := range kept {
		catchUp, cancel := context.WithCancel(ctx)
		ks.mu.Lock()
		current := ks.standbys[part] == sb && sb.store != nil // opened on this goroutine
		if current {
			sb.cancel = cancel
		}
		ks.mu.Unlock()
		if current {
			// What is committed now (Stable): a transaction the owner
			// left open holds no catch-up, nor the others after it.
			started := time.Now()
			_, err := r.Restore(catchUp, ks.cfg.changelog, part, followed{sb.store, sb, ks, part}, changelog.Options{Timeout: 30 * time.Second, Logger: logger, Stable: true})
			switch {
			case err != nil && catchUp.Err() == nil && !errors.Is(err, errStandbyGone):
				logger.Warn("eos: a standby's catch-up failed; it tries again", "partition", part, "err", err)
			case err == nil:
				ks.mu.Lock()
				if ks.standbys[part] == sb {
					sb.caughtAt = started
					if !sb.caught {
						sb.caught = true
						ks.noteWarmLocked()
					}
				}
				ks.mu.Unlock()
			}
		}
		cancel()
	}
	return nil
}

// noteWarmLocked records, for the group's next balance (standbyBalancer),
// the partitions this instance holds warm: its standbys once caught up
// and the stores it keeps of partitions taken away. Every change to
// either calls it (ks.mu held).
func (ks *keyedState) noteWarmLocked() {
	if ks.cfg.warm == nil {
		return
	}
	warm := make([]int32, 0, len(ks.standbys)+len(ks.parked))
	for p, sb := range ks.standbys {
		if sb.caught {
			warm = append(warm, p)
		}
	}
	for p := range ks.parked {
		warm = append(warm, p)
	}
	slices.Sort(warm)
	ks.cfg.warm.Store(&warm)
}

// takeStandby hands p's standby store, if this instance keeps one, to
// its restore, once a catch-up under way ended (ks.mu not held: the
// catch-up reads it).
func (ks *keyedState) takeStandby(p int32) (state.Store, bool) {
	ks.mu.Lock()
	sb, ok := ks.standbys[p]
	delete(ks.standbys, p)
	ks.noteWarmLocked()
	if ok && sb.cancel != nil {
		sb.cancel() // the restore takes up from where the catch-up got
	}
	ks.mu.Unlock()
	if !ok {
		return nil, false
	}
	// Waits for a write or a read under way, or the opening; the
	// cancelled catch-up's later writes fail (gone).
	sb.lock()
	defer sb.unlock()
	if sb.gone {
		return nil, false // closed meanwhile (dropStandby): opened afresh
	}
	sb.gone = true
	return sb.store, sb.store != nil
}
