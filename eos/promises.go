package eos

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// promises counts the produce promises of a transaction or batch that have
// not returned yet. franz-go finishes a record that failed before it was
// buffered (larger than MaxBufferedBytes, ErrMaxBuffered under manual
// flushing, a context that ended while Produce blocked) on another
// goroutine, possibly after Flush returned; deciding to commit before its
// promise ran commits without that output. So nothing is decided until
// wait returns nil.
type promises struct {
	wg      sync.WaitGroup
	pending atomic.Int64
}

// add notes one record about to be produced; its promise must call done.
func (p *promises) add() {
	p.wg.Add(1)
	p.pending.Add(1)
}

func (p *promises) done() {
	p.pending.Add(-1)
	p.wg.Done()
}

// wait returns once every promise returned, or an error saying how many
// had not when ctx ended.
func (p *promises) wait(ctx context.Context) error {
	if p.pending.Load() == 0 {
		return nil
	}
	settled := make(chan struct{})
	go func() { p.wg.Wait(); close(settled) }() // franz-go calls every promise, so this ends
	select {
	case <-settled:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("eos: %d produced records still unsettled: %w", p.pending.Load(), ctx.Err())
	}
}
