package loop

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
)

// handlerTimes records what Handled receives.
type handlerTimes struct {
	eoskit.NopMetrics
	mu    sync.Mutex
	times []time.Duration
}

func (h *handlerTimes) Handled(d time.Duration, _ bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.times = append(h.times, d)
}

// HandleTimed gives the metrics every call's time, and its caller a
// failed call's: with or without metrics, a call that fails reports how
// long it ran (eos's budget weighs it), and one that succeeds reports 0.
func TestHandleTimedTimesWhatIsObserved(t *testing.T) {
	const nap = 20 * time.Millisecond
	slow := func(err error) func() error {
		return func() error { time.Sleep(nap); return err }
	}
	errSlow := errors.New("slow")

	m := &handlerTimes{}
	for _, obs := range []*Observer{NewObserver("eos", "g", nil), NewObserver("eos", "g", m)} {
		took, err := obs.HandleTimed("eos", slow(nil))
		if err != nil || took != 0 {
			t.Fatalf("a call that succeeded: took %v, err %v; want 0, nil", took, err)
		}
		took, err = obs.HandleTimed("eos", slow(errSlow))
		if !errors.Is(err, errSlow) || took < nap {
			t.Fatalf("a call that failed after %v: took %v, err %v", nap, took, err)
		}
		took, err = obs.HandleTimed("eos", func() error { time.Sleep(nap); panic("boom") })
		if err == nil || took < nap {
			t.Fatalf("a call that panicked after %v: took %v, err %v", nap, took, err)
		}
	}
	if len(m.times) != 3 {
		t.Fatalf("the metrics received %d handler times, want 3", len(m.times))
	}
	for i, d := range m.times {
		if d < nap {
			t.Errorf("handler time %d = %v, want at least %v", i, d, nap)
		}
	}
}
