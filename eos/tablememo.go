package eos

import "sync/atomic"

// memoTables is how many of a processor's co-partitioned tables (the
// first ones, in WithTables' order) a partition's memo remembers the
// position of; a join of any other reads its position from the state
// for every record, as all did before.
const memoTables = 2

// tablePositions are the positions of a partition's tables (by index:
// see tableFollower.index), each the offset of its next record to apply,
// encoded by memoOf (0: unknown). A partition's memo holds them as its
// transaction sees them; a handler call's stateCtx holds its own moves,
// which the memo takes when the runner keeps the call's writes (kept),
// and which go with the call otherwise. They save a join the read, the
// copy and the parse of the position from the store for every record,
// as clockMemo.at does the stream time's; the memo forgets them with the
// rest (an abort, a restore).
type tablePositions [memoTables]atomic.Int64

// tablePosition returns the position of the table of index i as the call
// sees it: its own move, else the transaction's; ok is false when
// neither is known.
func (c *stateCtx) tablePosition(i int) (pos int64, ok bool) {
	if c == nil || i < 0 || i >= memoTables {
		return 0, false
	}
	enc := c.tablesMoved[i]
	if enc == 0 && c.memo != nil {
		enc = c.memo.tables[i].Load()
	}
	if enc == 0 {
		return 0, false
	}
	return enc - 2, true
}

// learnedTablePosition remembers the position of the table of index i
// the call read from its state, as the transaction's, if the call did
// not move it (a read after the call's own move sees the move).
func (c *stateCtx) learnedTablePosition(i int, pos int64) {
	if c == nil || c.memo == nil || i < 0 || i >= memoTables || c.tablesMoved[i] != 0 {
		return
	}
	if enc, ok := memoOf(pos); ok {
		c.memo.tables[i].Store(enc)
	}
}

// movedTable notes that the call wrote the position pos of the table of
// index i.
func (c *stateCtx) movedTable(i int, pos int64) {
	if c == nil || i < 0 || i >= memoTables {
		return
	}
	enc, ok := memoOf(pos)
	if !ok {
		// No offset: the call's reads go to its KV, which holds the
		// write, and the partition's memo forgets (as moved does).
		c.memo.forget()
		c.memo = nil
		c.tablesMoved = [memoTables]int64{}
		return
	}
	c.tablesMoved[i] = enc
}
