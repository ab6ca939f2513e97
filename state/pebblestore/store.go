package pebblestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/eoskit/eoskit/state"
)

// The pebble store keeps one database per changelog partition, its keys
// in two ranges: the checkpoint under metaCheckpoint, the user's keys
// behind the dataPrefix byte (so that Range and Reset cover them with
// simple bounds, and no user key can be taken for the checkpoint).
var (
	metaCheckpoint = []byte{0x00, 'c', 'p'}
	dataLower      = []byte{0x01}
	dataUpper      = []byte{0x02}
)

// checkpointVersion is the first byte of the stored checkpoint: a store
// written by a later format is refused rather than misread.
const checkpointVersion = 1

// Store is the disk-backed [state.Store] on github.com/cockroachdb/pebble: one
// database per changelog partition, in a directory of its own. Each Apply
// is one pebble batch holding the writes and the new checkpoint, so a
// crash leaves the database as some Apply left it with the checkpoint
// that says so; a restart restores only the changelog's tail, from the
// checkpoint on.
//
// Batches are written without an fsync (pebble.NoSync), and a goroutine
// of the store syncs the write-ahead log once a second while batches
// came (see [SyncEvery]): Kafka, not the disk, is the source of truth.
// pebble may keep an unsynced batch in its own buffer (its log is written
// by 32 KiB blocks, and the rest when its flusher next runs), so a
// process killed (SIGKILL, an OOM kill) or a machine that crashes loses
// at most the batches since the last sync; the log comes back as a prefix
// of the batches, checkpoint included, and the restore reads again what
// was lost: the changelog past the last second or so, not the whole of
// it. A store is never ahead of what committed in Kafka, since a runner
// applies a transaction only once it committed. pebble.Options with
// DisableWAL void this: a kill then loses everything since the last
// flush of the memtable.
type Store struct {
	dir string
	// syncEvery is SyncEvery's; dirty is set by each batch and cleared
	// by the sync that covers it; stop ends the syncing goroutine, which
	// closes synced when it returned.
	syncEvery time.Duration
	dirty     atomic.Bool
	logger    pebble.Logger
	stop      chan struct{}
	stopOnce  sync.Once
	synced    chan struct{}

	// mu is held for reading by every use of db, for writing by Close
	// alone; wmu serializes Apply and Reset. A Range does not hold up an
	// Apply (its iterator reads a snapshot), only a Close.
	mu     sync.RWMutex
	wmu    sync.Mutex
	db     *pebble.DB
	cp     atomic.Pointer[state.Checkpoint]
	closed bool
}

var _ state.Store = (*Store)(nil)

// Open opens the pebble store in dir, which holds one changelog
// partition's state and nothing else, creating dir and its missing
// parents 0700 (the state is the application's records: its owner's
// alone). Its checkpoint is the one the last Apply or Reset wrote (zero
// for a new store). o is passed to pebble.Open (nil: pebble's defaults,
// with its informational logging off), with memtables of
// [DefaultMemTableSize] when it leaves MemTableSize 0; o.Logger receives
// pebble's own messages. One process at a time may open a directory (pebble locks it).
func Open(dir string, o *pebble.Options, opts ...Option) (*Store, error) {
	c := config{syncEvery: DefaultSyncEvery}
	for _, opt := range opts {
		opt(&c)
	}
	if o == nil {
		o = &pebble.Options{Logger: quietLogger{}}
	} else {
		o = o.Clone()
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	switch {
	case o.DisableWAL && c.syncEvery >= 0:
		return nil, fmt.Errorf("pebblestore: pebble store %s: DisableWAL leaves nothing to sync, and a kill loses every batch since the last memtable flush: give SyncEvery(-1) to accept that", dir)
	case c.syncEvery > 0:
		c.syncEvery = max(c.syncEvery, minSyncEvery)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pebblestore: pebble store %s: %w", dir, err)
	}
	db, err := pebble.Open(dir, o)
	if err != nil {
		return nil, fmt.Errorf("pebblestore: open pebble store %s: %w", dir, err)
	}
	cp, err := readCheckpoint(db)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pebblestore: pebble store %s: %w", dir, err)
	}
	p := &Store{dir: dir, db: db, syncEvery: c.syncEvery, logger: o.Logger, stop: make(chan struct{}), synced: make(chan struct{})}
	p.cp.Store(&cp)
	if c.syncEvery > 0 {
		go p.syncLoop()
	} else {
		close(p.synced)
	}
	return p, nil
}

// Factory is a [state.Factory] of [Open] stores under root, one
// directory per partition: root/<topic>/<partition>. A partition revoked
// and assigned again, or a process restarted, finds its store there and
// restores only the changelog's tail.
func Factory(root string, o *pebble.Options, opts ...Option) state.Factory {
	return func(topic string, partition int32) (state.Store, error) {
		return Open(Dir(root, topic, partition), o, opts...)
	}
}

// DefaultMemTableSize is the size of a store's memtables when the
// pebble.Options given to [Open] leave MemTableSize 0 (or none are
// given): 16 MiB, as Kafka Streams gives its RocksDB stores
// (write_buffer_size), not pebble's 4 MiB, which a restore of a
// partition larger than a few MiB flushes again and again (restoring
// 10 to 20% slower, `make bench`'s restore part). A store written to
// may hold two of them at once (pebble's MemTableStopWritesThreshold)
// while one flushes, and every open store counts: the partitions an
// instance owns, its standbys (eos.Standbys) and the stores it keeps of
// partitions taken away. With many of them on one instance, give a
// smaller size.
const DefaultMemTableSize = 16 << 20

// DefaultSyncEvery is how often a store syncs its log by default.
const DefaultSyncEvery = time.Second

// minSyncEvery is the least positive SyncEvery a store takes.
const minSyncEvery = 10 * time.Millisecond

// Option configures a store ([Open], [Factory]).
type Option func(*config)

type config struct {
	syncEvery time.Duration
}

// SyncEvery sets how often the store syncs pebble's log (an fsync), from
// a goroutine of its own, when batches came since the last sync (default
// [DefaultSyncEvery]; at least 10 ms): a process killed, or a machine
// that crashes, then loses at most the last d (plus an fsync's time) of
// transactions, which the restart restores again from the changelog.
// pebble.Options with DisableWAL are refused unless d is negative. 0 syncs in each Apply (each
// transaction durable before Apply returns: an fsync per transaction and
// partition, under the processor's commit); a negative d never syncs (a
// kill loses what pebble still held in its buffer: for a store that
// opened empty and stayed small, everything, and so a whole restore;
// pebble still syncs its log when the store closes).
func SyncEvery(d time.Duration) Option { return func(c *config) { c.syncEvery = d } }

// Dir is the directory [Factory] keeps a partition's store in.
// Kafka topic names are safe as directory names ("." and ".." are not
// topic names).
func Dir(root, topic string, partition int32) string {
	return filepath.Join(root, topic, strconv.Itoa(int(partition)))
}

// Dir returns the store's directory.
func (p *Store) Dir() string { return p.dir }

func readCheckpoint(db *pebble.DB) (state.Checkpoint, error) {
	v, closer, err := db.Get(metaCheckpoint)
	if errors.Is(err, pebble.ErrNotFound) {
		return state.Checkpoint{}, nil
	}
	if err != nil {
		return state.Checkpoint{}, fmt.Errorf("read checkpoint: %w", err)
	}
	defer closer.Close()
	if len(v) != 1+16+8 || v[0] != checkpointVersion {
		return state.Checkpoint{}, fmt.Errorf("checkpoint of %d bytes, version %d: not written by this version of eoskit", len(v), firstByte(v))
	}
	var cp state.Checkpoint
	copy(cp.TopicID[:], v[1:17])
	cp.Offset = int64(binary.BigEndian.Uint64(v[17:]))
	return cp, nil
}

func firstByte(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	return int(v[0])
}

func encodeCheckpoint(cp state.Checkpoint) []byte {
	v := make([]byte, 1+16+8)
	v[0] = checkpointVersion
	copy(v[1:], cp.TopicID[:])
	binary.BigEndian.PutUint64(v[17:], uint64(cp.Offset))
	return v
}

func dataKey(key []byte) []byte {
	k := make([]byte, 1+len(key))
	k[0] = dataLower[0]
	copy(k[1:], key)
	return k
}

// Get implements [state.Reader].
func (p *Store) Get(key []byte) ([]byte, bool, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, false, state.ErrClosed
	}
	v, closer, err := p.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pebblestore: pebble get: %w", err)
	}
	defer closer.Close()
	return append([]byte{}, v...), true, nil
}

// Range implements [state.Reader], in key order, over a snapshot: Apply does
// not wait for it.
func (p *Store) Range(fn func(key, value []byte) bool) error {
	return p.Scan(nil, nil, fn)
}

var _ state.Scanner = (*Store)(nil)

// Scan implements [state.Scanner]: the keys from start to end, in key
// order, over a snapshot (Apply does not wait for it), reading only the
// range.
func (p *Store) Scan(start, end []byte, fn func(key, value []byte) bool) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return state.ErrClosed
	}
	if start != nil && end != nil && bytes.Compare(start, end) >= 0 {
		return nil // an empty range
	}
	lower, upper := dataLower, dataUpper
	if start != nil {
		lower = dataKey(start)
	}
	if end != nil {
		upper = dataKey(end)
	}
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("pebblestore: pebble iterate: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("pebblestore: pebble iterate: %w", err)
		}
		if !fn(it.Key()[1:], v) {
			break
		}
	}
	if err := it.Error(); err != nil {
		_ = it.Close()
		return fmt.Errorf("pebblestore: pebble iterate: %w", err)
	}
	return it.Close()
}

// Checkpoint implements [state.Reader].
func (p *Store) Checkpoint() state.Checkpoint {
	return *p.cp.Load()
}

// Apply implements [state.Store]: one pebble batch, the checkpoint included.
func (p *Store) Apply(writes []state.Write, cp state.Checkpoint) error {
	return p.write(cp, func(b *pebble.Batch) error {
		if err := p.Checkpoint().CheckApply(cp); err != nil {
			return err
		}
		for _, w := range writes {
			var err error
			if w.Value == nil {
				err = b.Delete(dataKey(w.Key), nil)
			} else {
				err = b.Set(dataKey(w.Key), w.Value, nil)
			}
			if err != nil {
				return fmt.Errorf("pebblestore: pebble batch: %w", err)
			}
		}
		return nil
	})
}

// Reset implements [state.Store]: a range deletion of every key and the new
// checkpoint, in one batch.
func (p *Store) Reset(cp state.Checkpoint) error {
	return p.write(cp, func(b *pebble.Batch) error {
		if err := b.DeleteRange(dataLower, dataUpper, nil); err != nil {
			return fmt.Errorf("pebblestore: pebble batch: %w", err)
		}
		return nil
	})
}

// write commits one batch, filled by fill, with the checkpoint cp.
func (p *Store) write(cp state.Checkpoint, fill func(*pebble.Batch) error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if p.closed {
		return state.ErrClosed
	}
	b := p.db.NewBatch()
	defer b.Close()
	if err := fill(b); err != nil {
		return err
	}
	return p.commit(b, cp)
}

func (p *Store) commit(b *pebble.Batch, cp state.Checkpoint) error {
	if err := b.Set(metaCheckpoint, encodeCheckpoint(cp), nil); err != nil {
		return fmt.Errorf("pebblestore: pebble batch: %w", err)
	}
	wo := pebble.NoSync
	if p.syncEvery == 0 {
		wo = pebble.Sync
	}
	if err := b.Commit(wo); err != nil {
		return fmt.Errorf("pebblestore: pebble commit: %w", err)
	}
	p.dirty.Store(true)
	p.cp.Store(&cp)
	return nil
}

// syncLoop syncs the log every syncEvery while batches came, until Close.
// A sync that fails is logged (pebble's logger) and tried again at the
// next tick; a failing fsync is fatal inside pebble itself.
func (p *Store) syncLoop() {
	defer close(p.synced)
	t := time.NewTicker(p.syncEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if !p.dirty.Swap(false) {
			continue
		}
		if err := p.syncLog(); err != nil && !errors.Is(err, state.ErrClosed) {
			p.dirty.Store(true)
			if p.logger != nil {
				p.logger.Errorf("pebblestore: sync the log of %s: %v", p.dir, err)
			}
		}
	}
}

// syncLog makes pebble's log durable up to its last batch: a log-only
// batch committed with Sync (pebble writes and syncs its log in order).
func (p *Store) syncLog() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return state.ErrClosed
	}
	return p.db.LogData(nil, pebble.Sync)
}

// Close implements [state.Store]: it flushes nothing it need not (the
// write-ahead log holds every batch) and releases the directory.
func (p *Store) Close() error {
	// The syncing goroutine first: it takes mu to sync.
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.synced
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if err := p.db.Close(); err != nil {
		return fmt.Errorf("pebblestore: close pebble store %s: %w", p.dir, err)
	}
	return nil
}

// quietLogger drops pebble's informational messages (one per flush and
// compaction) and passes its errors on to pebble's default logger.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)           {}
func (quietLogger) Errorf(format string, a ...any) { pebble.DefaultLogger.Errorf(format, a...) }
func (quietLogger) Fatalf(format string, a ...any) { pebble.DefaultLogger.Fatalf(format, a...) }
