package eos

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Records are added and settled by many goroutines while others wait, as
// concurrent Tx.Produce calls and ProduceSync do: every wait returns once
// what was added before it settled, and a wait bounded by a context says
// how many are still pending. (A sync.WaitGroup panics on this use.)
func TestPromisesAddWhileWaiting(t *testing.T) {
	var p promises
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				p.add()
				go p.done()
				if err := p.wait(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := p.wait(context.Background()); err != nil {
		t.Fatal(err)
	}

	p.add()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with one promise pending returned %v; want the context's deadline", err)
	}
	p.done()
	if err := p.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
