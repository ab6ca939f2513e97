package eos

import (
	"context"
	"fmt"
	"sync"
)

// promises counts the produce promises of a transaction or batch that have
// not returned yet. franz-go finishes a record that failed before it was
// buffered (larger than MaxBufferedBytes, ErrMaxBuffered under manual
// flushing, a context that ended while Produce blocked) on another
// goroutine, possibly after Flush returned; deciding to commit before its
// promise ran commits without that output. So nothing is decided until
// wait returns nil. Unlike a sync.WaitGroup, records may be added while
// another goroutine waits (Tx.Produce is safe for concurrent use).
type promises struct {
	mu      sync.Mutex
	pending int
	settled chan struct{} // closed when pending drops to 0; nil while 0
}

// add notes one record about to be produced; its promise must call done.
func (p *promises) add() { p.addN(1) }

// addN notes n records about to be produced; each one's promise must call
// done.
func (p *promises) addN(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == 0 {
		p.settled = make(chan struct{})
	}
	p.pending += n
}

func (p *promises) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending--
	if p.pending == 0 {
		close(p.settled)
		p.settled = nil
	}
}

// settle flushes the client (flush is its Flush) and then waits for every
// promise: Flush alone does not wait for records failed before buffering.
func (p *promises) settle(ctx context.Context, flush func(context.Context) error) error {
	if err := flush(ctx); err != nil {
		return err
	}
	return p.wait(ctx)
}

// wait returns once every promise added so far returned, or an error
// saying how many had not when ctx ended.
func (p *promises) wait(ctx context.Context) error {
	p.mu.Lock()
	settled := p.settled
	p.mu.Unlock()
	if settled == nil {
		return nil
	}
	select {
	case <-settled:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		return fmt.Errorf("eos: %d produced records still unsettled: %w", p.pending, ctx.Err())
	}
}
