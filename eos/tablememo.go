package eos

import "sync/atomic"

// memoTables is how many of a processor's co-partitioned tables (the
// first ones, in WithTables' order) a partition's memo remembers the
// position of; a join of any other reads its position from the state
// for every record, as all did before.
const memoTables = 2

// tableMemo is a table's position on a partition (the offset of its next
// record to apply, encoded by memoOf: 0 is unknown): at as the
// partition's transaction sees it, call as the handler call under way
// moved it (0: it did not), which the call's end keeps into at or drops
// with the call's writes. It saves a join the read, the copy and the
// parse of the position from the store for every record, as clockMemo.at
// does the stream time's; the partition's memo forgets it with the rest
// (an abort, a restore).
type tableMemo struct{ at, call atomic.Int64 }

// tableMemo returns the memo of the table of index i (see
// tableFollower.index) on the call's partition, or nil.
func (c *stateCtx) tableMemo(i int) *tableMemo {
	if c == nil || c.memo == nil || i < 0 || i >= memoTables {
		return nil
	}
	return &c.memo.tables[i]
}

// tablePosition returns the position of the table of index i as the call
// sees it: its own move, else the transaction's; ok is false when the
// memo knows neither.
func (c *stateCtx) tablePosition(i int) (pos int64, ok bool) {
	m := c.tableMemo(i)
	if m == nil {
		return 0, false
	}
	enc := m.call.Load()
	if enc == 0 {
		enc = m.at.Load()
	}
	if enc == 0 {
		return 0, false
	}
	return enc - 2, true
}

// learnedTablePosition remembers the position of the table of index i
// the call read from its state, as the transaction's if the call did not
// move it (a read after the call's own move sees the move).
func (c *stateCtx) learnedTablePosition(i int, pos int64) {
	m := c.tableMemo(i)
	if m == nil || m.call.Load() != 0 {
		return
	}
	if enc, ok := memoOf(pos); ok {
		m.at.Store(enc)
	}
}

// movedTable notes that the call wrote the position pos of the table of
// index i.
func (c *stateCtx) movedTable(i int, pos int64) {
	m := c.tableMemo(i)
	if m == nil {
		return
	}
	enc, ok := memoOf(pos)
	if !ok {
		// No offset: the call's reads go to its KV, which holds the
		// write, and the partition's memo forgets (as moved does).
		c.memo.forget()
		c.memo = nil
		return
	}
	m.call.Store(enc)
}

// keptTables moves the call's table moves into the transaction's
// positions (its writes were kept); droppedTables forgets them (its
// writes were dropped). m is the call's memo.
func (m *clockMemo) keptTables() {
	for i := range m.tables {
		if enc := m.tables[i].call.Swap(0); enc != 0 {
			m.tables[i].at.Store(enc)
		}
	}
}

func (m *clockMemo) droppedTables() {
	for i := range m.tables {
		m.tables[i].call.Store(0)
	}
}
