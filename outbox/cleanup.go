package outbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// maxCarriedRanges bounds the rows a position record names as published
// but not yet deleted (in ranges of consecutive ids of one transaction),
// so that the record stays well under the position topic's
// max.message.bytes (1 MB by default): about 40 bytes a range.
const maxCarriedRanges = 10000

// undeleted is the rows the relay published (or is publishing) whose
// deletion did not find them, by id, with the id of the database
// transaction that wrote them: a transaction's commit reaches the log,
// and the relay, before other sessions see its rows (a moment usually;
// as long as a synchronous standby takes to acknowledge it under
// synchronous replication). They are deleted later: with every batch, at
// every session's start and every status interval. Each position record
// carries them, so that a relay that stops (or crashes) before it could
// delete them leaves them to the next relay, which reads them back with
// the position. A row leaves the set once deleted, or once its
// transaction is visible and the row is gone all the same (deleted by
// someone else).
type undeleted struct {
	mu  sync.Mutex
	ids map[int64]uint32 // row id -> the xid of its transaction
}

// carriedTxn is how a position record names one transaction's undeleted
// rows: its xid, and its ids as inclusive ranges.
type carriedTxn struct {
	Xid uint32     `json:"xid"`
	IDs [][2]int64 `json:"ids"`
}

// encodeCarried returns ids as a position record carries them: sorted, by
// transaction, in ranges of consecutive ids, at most maxCarriedRanges (the
// rest stays in memory only). dropped counts the rows left out.
func encodeCarried(ids map[int64]uint32) (out []carriedTxn, dropped int) {
	sorted := slices.Sorted(maps.Keys(ids))
	byXid := map[uint32]int{} // index in out
	ranges := 0
	for _, id := range sorted {
		xid := ids[id]
		i, ok := byXid[xid]
		if ok {
			last := &out[i].IDs[len(out[i].IDs)-1]
			if last[1]+1 == id {
				last[1] = id
				continue
			}
		}
		if ranges >= maxCarriedRanges {
			dropped++
			continue
		}
		if !ok {
			i = len(out)
			byXid[xid] = i
			out = append(out, carriedTxn{Xid: xid})
		}
		out[i].IDs = append(out[i].IDs, [2]int64{id, id})
		ranges++
	}
	return out, dropped
}

// decodeCarried is encodeCarried's inverse, into ids.
func decodeCarried(txns []carriedTxn, ids map[int64]uint32) {
	for _, t := range txns {
		for _, r := range t.IDs {
			for id := r[0]; id <= r[1] && id-r[0] < 1<<20; id++ {
				ids[id] = t.Xid
			}
		}
	}
}

// snapshot is a PostgreSQL snapshot (pg_current_snapshot()), as text:
// xmin:xmax:xip,...
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint32]bool
}

func parseSnapshot(s string) (snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("outbox: snapshot %q: want xmin:xmax:xip", s)
	}
	var snap snapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("outbox: snapshot %q: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("outbox: snapshot %q: %w", s, err)
	}
	snap.xip = map[uint32]bool{}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshot{}, fmt.Errorf("outbox: snapshot %q: %w", s, err)
			}
			snap.xip[uint32(v)] = true
		}
	}
	return snap, nil
}

// visible reports whether the transaction xid (32 bits, as the log gives
// it) had ended by the snapshot, so that its rows, if any remain, were
// visible to the statement that took it. A committed xid is within 2^31
// of xmax (wraparound protection), which settles its epoch.
func (s snapshot) visible(xid uint32) bool {
	d := int32(xid - uint32(s.xmax))
	if d >= 0 {
		return false // at or past xmax: not ended when the snapshot was taken
	}
	full := int64(s.xmax) + int64(d)
	return full < int64(s.xmin) || !s.xip[xid]
}

// deleteIDs deletes the rows ids names from the outbox table, in
// statements of at most batch ids, and returns those that remain to
// delete: not found, and their transaction not visible to the statement
// (hide, a test's, passes over some as if so).
func deleteIDs(ctx context.Context, pool *pgxpool.Pool, table string, ids map[int64]uint32, batch int, hide func(int64) bool) (map[int64]uint32, error) {
	left := map[int64]uint32{}
	sorted := slices.Sorted(maps.Keys(ids))
	for chunk := range slices.Chunk(sorted, batch) {
		send := make([]int64, 0, len(chunk))
		for _, id := range chunk {
			if hide != nil && hide(id) {
				left[id] = ids[id]
			} else {
				send = append(send, id)
			}
		}
		if len(send) == 0 {
			continue
		}
		// One statement, one snapshot: the deletion and the snapshot
		// that says whose rows it could see.
		var deleted []int64
		var snapText string
		err := pool.QueryRow(ctx, `WITH d AS (DELETE FROM `+ident(table)+` WHERE id = ANY($1) RETURNING id)
			SELECT coalesce((SELECT array_agg(id) FROM d), '{}'::bigint[]), pg_current_snapshot()::text`, send).Scan(&deleted, &snapText)
		if err != nil {
			return nil, fmt.Errorf("outbox: delete %d published rows: %w", len(send), err)
		}
		if len(deleted) == len(send) {
			continue
		}
		snap, err := parseSnapshot(snapText)
		if err != nil {
			return nil, err
		}
		gone := make(map[int64]bool, len(deleted))
		for _, id := range deleted {
			gone[id] = true
		}
		for _, id := range send {
			if xid := ids[id]; !gone[id] && !snap.visible(xid) {
				left[id] = xid
			}
		}
	}
	return left, nil
}

// deleteRows deletes the batch's rows, and those earlier batches
// could not, in statements of bounded size, and keeps its dead-lettered
// records in the dead-letter table. It runs before the Kafka commit: the
// rows stay in the write-ahead log the slot holds until that commit is
// confirmed, so an abort after it loses nothing. It returns the rows it
// could not delete yet (their transactions not visible yet), which the
// batch's position record carries: a relay that stops before it deletes
// them leaves them to the next.
func (r *Relay) deleteRows(ctx context.Context, b *pending) ([]carriedTxn, error) {
	if err := r.keepDead(ctx, b); err != nil {
		return nil, err
	}
	r.undeleted.mu.Lock()
	defer r.undeleted.mu.Unlock()
	want := maps.Clone(r.undeleted.ids)
	for _, t := range b.txns {
		for _, rw := range t.rows {
			want[rw.id] = t.xid
		}
	}
	left, err := deleteIDs(ctx, r.pool, r.cfg.table(), want, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	// Usually a few milliseconds make them visible.
	for try := 0; err == nil && try < 5 && len(left) > 0; try++ {
		time.Sleep(20 * time.Millisecond)
		left, err = deleteIDs(ctx, r.pool, r.cfg.table(), left, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	}
	if err != nil {
		// Keep what was wanted: the batch is not committed, and rows
		// already deleted are harmlessly looked for again.
		maps.Copy(r.undeleted.ids, want)
		return nil, err
	}
	r.undeleted.ids = left
	carry, dropped := encodeCarried(left)
	if dropped > 0 {
		r.cfg.logger.Warn("outbox: too many published rows not yet visible to delete; the position record names only some, the relay remembers the rest until it stops",
			"slot", r.cfg.slot, "rows", len(left), "not_carried", dropped)
	}
	return carry, nil
}

// sweep deletes the published rows earlier deletions could not find,
// those of earlier relays included (read back with the position).
func (r *Relay) sweep(ctx context.Context) {
	r.undeleted.mu.Lock()
	defer r.undeleted.mu.Unlock()
	if len(r.undeleted.ids) == 0 {
		return
	}
	left, err := deleteIDs(ctx, r.pool, r.cfg.table(), r.undeleted.ids, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.logger.Warn("outbox: deleting published rows failed; tried again in a status interval", "slot", r.cfg.slot, "rows", len(r.undeleted.ids), "err", err)
		}
		return
	}
	r.undeleted.ids = left
}

// keepDead copies the batch's dead-lettered records into the dead-letter
// table (again harmlessly, if an earlier attempt at the batch did).
func (r *Relay) keepDead(ctx context.Context, b *pending) error {
	if len(b.dead) == 0 {
		return nil
	}
	var ids []int64
	var topics, errs []string
	var parts []*int32
	var keys, values, headers [][]byte
	for _, t := range b.txns {
		for _, rw := range t.rows {
			cause, d := b.dead[rw.id]
			if !d {
				continue
			}
			var p *int32
			if rw.partition >= 0 {
				p = &rw.partition
			}
			ids, topics, parts, errs = append(ids, rw.id), append(topics, rw.rec.Topic), append(parts, p), append(errs, cause.Error())
			keys, values, headers = append(keys, rw.rec.Key), append(values, rw.rec.Value), append(headers, encodeHeaders(rw.rec.Headers))
		}
	}
	_, err := r.pool.Exec(ctx, `INSERT INTO `+ident(r.cfg.deadLetters())+` (id, topic, partition, key, value, headers, error)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::bytea[], $5::bytea[], $6::bytea[], $7::text[])
		ON CONFLICT (id) DO NOTHING`, ids, topics, parts, keys, values, headers, errs)
	if err != nil {
		return fmt.Errorf("outbox: keep %d dead-lettered records: %w", len(ids), err)
	}
	return nil
}
