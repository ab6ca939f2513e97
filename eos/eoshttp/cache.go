package eoshttp

import (
	"sync"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
)

// Cache makes [Partition] render a partition once per committed change of
// its state rather than once per request: it keeps each partition's JSON
// with the store's checkpoint it was rendered at
// (eos.StateView.Checkpoint), answers from it while the checkpoint has not
// moved, and renders again, once for the requests waiting meanwhile, when
// it has. Every answer still checks that this instance holds the
// partition, restored. render must then depend on the partition's
// committed state alone (not on the clock, nor on other partitions), or
// its answers stay as first rendered until the next commit that changes
// the partition. It holds one rendered answer per partition asked for.
// [Handler] ignores it. Default: off, a render per request.
func Cache() Option {
	return func(o *options) { o.cache = &partitionCache{parts: map[int32]*cachedPartition{}} }
}

// partitionCache is Cache's rendered answers, by partition.
type partitionCache struct {
	mu    sync.Mutex
	parts map[int32]*cachedPartition
}

// cachedPartition is one partition's answer; mu is held while it is
// rendered, so that the requests coming meanwhile wait for it.
type cachedPartition struct {
	mu   sync.Mutex
	at   state.Checkpoint
	body []byte
	ok   bool
}

// answer returns p's JSON as render makes it of view, rendered again only
// when p's checkpoint moved since the last render, or the error that
// refused it (a *eos.NotHeldError for a partition not held here,
// restored).
func (c *partitionCache) answer(view *eos.StateView, p int32, render func() ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	e := c.parts[p]
	if e == nil {
		e = &cachedPartition{}
		c.parts[p] = e
	}
	c.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	// Read before rendering: a commit landing during the render leaves
	// a body newer than its checkpoint, rendered again next time.
	at, err := view.Checkpoint(p)
	if err != nil {
		return nil, err
	}
	if e.ok && e.at == at {
		return e.body, nil
	}
	body, err := render()
	if err != nil {
		e.ok = false
		return nil, err
	}
	e.at, e.body, e.ok = at, body, true
	return body, nil
}
