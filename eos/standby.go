package eos

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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
// standby never serves reads nor writes: [StateView] shows only the
// partitions an instance owns.
//
// Placement: the members that advertise an [Endpoint] (which Standbys
// needs), in the order of their endpoints; a partition's standbys are the
// n members after its owner, wrapping around, whatever the balancer
// (KIP-848 included). What it costs: each standby reads its partitions'
// changelog as the owner writes it, and holds their state (memory, or
// disk with pebble) beside its own. Default 0.
func Standbys(n int) StateOption {
	return stateOpt(func(c *stateConfig) { c.standbys = n })
}

// standbyEvery is how often an instance looks at the group and catches
// its standby stores up.
const standbyEvery = time.Second

// standbyPartitions returns the partitions self keeps warm: each
// partition whose owner is another member and among whose n followers,
// in members' order (sorted, wrapping around), self is.
func standbyPartitions(owners map[int32]string, members []string, self string, n int) []int32 {
	at := slices.Index(members, self)
	if at < 0 || n <= 0 {
		return nil
	}
	var out []int32
	for p, owner := range owners {
		o := slices.Index(members, owner)
		if o < 0 || o == at {
			continue
		}
		// self is the k-th member after the owner.
		if k := (at - o + len(members)) % len(members); k >= 1 && k <= n {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// standby is a store kept warm for a partition another member owns; mu
// is held while it catches up, and by prepare taking it over.
type standby struct {
	mu    sync.Mutex
	store state.Store
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
		for loop.Sleep(followCtx, standbyEvery) {
			ks.followStandbysOnce(followCtx, r, p.cfg.endpoint, quiet)
		}
	}()
	return func() {
		cancel()
		<-done
		r.Close()
		ks.mu.Lock()
		defer ks.mu.Unlock()
		for part, sb := range ks.standbys {
			delete(ks.standbys, part)
			sb.mu.Lock()
			_ = sb.store.Close()
			sb.mu.Unlock()
		}
	}, nil
}

// followStandbysOnce places this instance's standbys from the group's
// description, opens the stores of the partitions it newly keeps, closes
// those it no longer keeps, and catches each up with the changelog.
func (ks *keyedState) followStandbysOnce(ctx context.Context, r *changelog.Restorer, self string, logger *slog.Logger) {
	owners, members, err := ks.owners.snapshot(ctx)
	if err != nil {
		return // the group could not be described: try again next time
	}
	want := standbyPartitions(owners, members, self, ks.cfg.standbys)
	ks.mu.Lock()
	for part, sb := range ks.standbys {
		// A partition nobody holds (a rebalance under way: maybe this
		// instance's next) keeps its standby; one another member holds
		// without this one among its standbys loses it.
		if owner := owners[part]; owner != "" && owner != self && !slices.Contains(want, part) {
			delete(ks.standbys, part)
			go func() { // a catch-up may hold it
				sb.mu.Lock()
				defer sb.mu.Unlock()
				_ = sb.store.Close()
			}()
		}
	}
	var open []int32
	for _, part := range want {
		_, held := ks.parts[part]
		pk, parked := ks.parked[part]
		_, kept := ks.standbys[part]
		switch {
		case parked:
			// Taken away from this instance, which now keeps it warm:
			// its store goes on from its checkpoint.
			delete(ks.parked, part)
			ks.standbys[part] = &standby{store: pk.store}
		case !held && !kept:
			open = append(open, part)
		}
	}
	ks.mu.Unlock()
	for _, part := range open {
		s, err := ks.cfg.stores(ks.cfg.changelog, part)
		if err != nil {
			logger.Warn("eos: opening a standby store failed", "partition", part, "err", err)
			continue
		}
		ks.mu.Lock()
		_, held := ks.parts[part]
		_, parked := ks.parked[part]
		if held || parked {
			ks.mu.Unlock()
			_ = s.Close()
			continue
		}
		ks.standbys[part] = &standby{store: s}
		ks.mu.Unlock()
	}
	ks.mu.RLock()
	kept := make(map[int32]*standby, len(ks.standbys))
	for part, sb := range ks.standbys {
		kept[part] = sb
	}
	ks.mu.RUnlock()
	for part, sb := range kept {
		sb.mu.Lock()
		ks.mu.RLock()
		current := ks.standbys[part] == sb
		ks.mu.RUnlock()
		if current {
			if _, err := r.Restore(ctx, ks.cfg.changelog, part, sb.store, changelog.Options{Timeout: 30 * time.Second, Logger: logger}); err != nil && ctx.Err() == nil {
				logger.Warn("eos: a standby's catch-up failed; it tries again", "partition", part, "err", err)
			}
		}
		sb.mu.Unlock()
	}
}

// takeStandby hands p's standby store, if this instance keeps one, to
// its restore, once a catch-up under way ended (ks.mu not held: the
// catch-up reads it).
func (ks *keyedState) takeStandby(p int32) (state.Store, bool) {
	ks.mu.Lock()
	sb, ok := ks.standbys[p]
	delete(ks.standbys, p)
	ks.mu.Unlock()
	if !ok {
		return nil, false
	}
	sb.mu.Lock() // waits for a catch-up: the next one finds it taken
	defer sb.mu.Unlock()
	return sb.store, true
}

// Standbys lists the partitions this instance keeps warm for others (see
// [Standbys]); they are not readable here.
func (v *StateView) Standbys() []int32 {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	var ps []int32
	for p := range v.ks.standbys {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}
