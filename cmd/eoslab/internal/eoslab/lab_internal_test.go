package eoslab

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLabStepThatCannotProgressFailsWithinItsBound checks the lab's
// deadlines: a run whose consumers never commit, or whose handlers never
// reach a fault, fails with a *StepError naming the pattern and the step,
// wrapping ErrStalled and saying where the group stood, within its
// StepTimeout, instead of hanging.
func TestLabStepThatCannotProgressFailsWithinItsBound(t *testing.T) {
	const bound = 2 * time.Second
	for _, tc := range []struct {
		name      string
		committed int64 // what progress reports, of 100 written
		step      string
	}{
		{"no commits", 0, "crash: waiting for the first commits"},
		{"no handler reaches the fault", 100, "crash: waiting for a handler mid-batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := Pattern{Name: "stuck", run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
				// An instance that never calls its handler: it waits to
				// be stopped, as a consumer with nothing to poll does.
				idle := func(ctx context.Context, _ string, _ []kgo.Opt, _ func(string)) error { <-ctx.Done(); return nil }
				feed := func(context.Context, int, int) error { return nil }
				progress := func(context.Context) (int64, int64, error) { return tc.committed, 100, nil }
				group := func(context.Context) (groupView, error) { return groupView{state: "Stable"}, nil }
				_, err := l.churn(ctx, p, idle, feed, progress, group, nil)
				return result{}, err
			}}
			lab := &Lab{StepTimeout: bound}
			began := time.Now()
			_, err := lab.Run(context.Background(), p)
			took := time.Since(began)
			var stepErr *StepError
			if !errors.As(err, &stepErr) || !errors.Is(err, ErrStalled) {
				t.Fatalf("Run returned %v; want a *StepError wrapping ErrStalled", err)
			}
			if stepErr.Pattern != "stuck" || stepErr.Step != tc.step || stepErr.Done != tc.committed || stepErr.Total != 100 {
				t.Errorf("error names pattern %q, step %q, progress %d of %d; want stuck, %q, %d of 100",
					stepErr.Pattern, stepErr.Step, stepErr.Done, stepErr.Total, tc.step, tc.committed)
			}
			if !strings.HasPrefix(stepErr.State, "group Stable") {
				t.Errorf("the stall describes the group as %q; want the group's state and members", stepErr.State)
			}
			if took < bound || took > bound+3*time.Second {
				t.Errorf("failed after %s; want just past its bound of %s", took, bound)
			}
			t.Logf("%v (after %s)", err, took.Round(time.Millisecond))
		})
	}
}

// A control's totals that a run's faults happened not to break are "not
// shown", never "yes": the table must not credit a weaker design.
func TestControlTotalsAreNeverCalledCorrect(t *testing.T) {
	for _, tc := range []struct {
		correct, control bool
		want             string
	}{
		{true, false, "yes"},
		{false, false, "no"},
		{false, true, "no"},
		{true, true, "not shown"},
	} {
		if got := totalsVerdict(tc.correct, tc.control); got != tc.want {
			t.Errorf("totalsVerdict(correct=%v, control=%v) = %q; want %q", tc.correct, tc.control, got, tc.want)
		}
	}
	for _, p := range All() {
		weaker := strings.HasPrefix(p.Name, "at-") || strings.Contains(p.Name, "in a map")
		if p.Control != weaker {
			t.Errorf("%s: Control = %v; want %v", p.Name, p.Control, weaker)
		}
	}
}

// A gate armed for one processor lets the other's calls through and
// catches the first call of that one, named with its instance; armed
// whole, it then holds every call of that launch, another launch of the
// same instance (a zombie's replacement) going on, until released.
func TestGateArmedForAProcessorCatchesOnlyItsCalls(t *testing.T) {
	g := newGate(0)
	defer g.close()
	c := g.arm("daily counts processor", true)
	// Passes: not the one armed for (were it caught, the ctx's end
	// would let it go, and the check below fail).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	g.wait(ctx, "a", "a-1", "totals processor")
	cancel()
	select {
	case got := <-c.caught:
		t.Fatalf("the gate caught %s, a call of the processor it was not armed for", got)
	default:
	}
	// waiting runs a call in the background; its channel closes once
	// the call goes on.
	waiting := func(instance, launch, processor string) chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); g.wait(context.Background(), instance, launch, processor) }()
		return done
	}
	caught := waiting("b", "b-2", "daily counts processor")
	select {
	case got := <-c.caught:
		if got.String() != "b (daily counts processor)" {
			t.Fatalf("caught %q; want b (daily counts processor)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the armed processor's call was not caught within 10 s")
	}
	sameLaunch := waiting("b", "b-2", "totals processor")
	replacement := waiting("b", "b-3", "totals processor")
	select {
	case <-replacement:
	case <-time.After(10 * time.Second):
		t.Fatal("another launch of the instance was held too")
	}
	select {
	case <-caught:
		t.Fatal("the caught call went on before its release")
	case <-sameLaunch:
		t.Fatal("a call of the launch held whole went on before its release")
	case <-time.After(50 * time.Millisecond):
	}
	c.free()
	for _, done := range []chan struct{}{caught, sameLaunch} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a held call was not released within 10 s of free")
		}
	}
	// Released: the launch's calls pass again.
	select {
	case <-waiting("b", "b-2", "totals processor"):
	case <-time.After(10 * time.Second):
		t.Fatal("a call of the released launch was held")
	}
}
