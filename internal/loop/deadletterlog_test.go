package loop

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a slog handler's output, safe to read while timers write it.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.buf.String()), "\n")
}

// A burst of dead letters logs one line with the first record's
// coordinates and error, then, once the interval has passed, one line
// counting the others with the last one's coordinates; neither holds the
// record's key or value, and an error quoting the record is cut short.
func TestDeadLetterLogRateLimits(t *testing.T) {
	var out lines
	clock := time.Unix(1_000_000, 0)
	l := NewDeadLetterLog(slog.New(slog.NewTextHandler(&out, nil)), "dead-lettered", time.Hour)
	l.now = func() time.Time { return clock }
	long := errors.New("parse: " + strings.Repeat("x", 1000))
	for off := range int64(1238) {
		l.Log("orders", 3, off, long, "dead_letter_topic", "dlq")
	}
	if got := out.get(); len(got) != 1 || !strings.Contains(got[0], "topic=orders partition=3 offset=0 ") ||
		!strings.Contains(got[0], "dead_letter_topic=dlq") || len(got[0]) > 450 {
		t.Fatalf("after the burst, lines = %q; want one line for offset 0, under 450 characters", got)
	}
	l.Flush()
	got := out.get()
	if len(got) != 2 || !strings.Contains(got[1], "not_logged=1237 ") || !strings.Contains(got[1], "offset=1237 ") {
		t.Fatalf("after Flush, lines = %q; want a second counting 1237 held back, ending at offset 1237", got)
	}
	l.Flush() // nothing held back: no line
	// Within the interval after the count: held back again; after it,
	// logged at once.
	l.Log("orders", 3, 5000, errParse)
	clock = clock.Add(time.Hour)
	l.Log("orders", 3, 5001, errParse)
	l.Flush()
	got = out.get()
	if len(got) != 4 || !strings.Contains(got[2], "offset=5001 ") || !strings.Contains(got[3], "not_logged=1 ") {
		t.Fatalf("lines = %q; want offset 5001 logged, then 5000 counted", got)
	}
}

// The records held back are counted in a line of their own once the
// interval has passed, without a further dead letter or Flush.
func TestDeadLetterLogFlushesOnItsOwn(t *testing.T) {
	var out lines
	l := NewDeadLetterLog(slog.New(slog.NewTextHandler(&out, nil)), "dead-lettered", 50*time.Millisecond)
	for off := range int64(10) {
		l.Log("orders", 0, off, errParse)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(out.get()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no count of the held-back dead letters within 5 s; lines %q", out.get())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := out.get(); len(got) != 2 || !strings.Contains(got[1], "not_logged=9 ") {
		t.Fatalf("lines = %q; want the second counting 9", got)
	}
}

// ErrorText cuts at a rune's start and marks the cut.
func TestErrorText(t *testing.T) {
	s := ErrorText(errors.New(strings.Repeat("é", 400)))
	if !strings.HasSuffix(s, "…") || len(s) > maxErrorText+len("…") || !strings.HasPrefix(s, "éé") || strings.ContainsRune(s, '\uFFFD') {
		t.Errorf("ErrorText = %q (%d bytes)", s, len(s))
	}
	if ErrorText(errParse) != "parse" || ErrorText(nil) != "" {
		t.Error("a short error changed")
	}
}

// IdleAfter leaves a rebalance's time after the session timeout.
func TestIdleAfter(t *testing.T) {
	for session, want := range map[time.Duration]time.Duration{45 * time.Second: 56250 * time.Millisecond, 6 * time.Second: 11 * time.Second} {
		if got := IdleAfter(session); got != want {
			t.Errorf("IdleAfter(%s) = %s; want %s", session, got, want)
		}
	}
}
