package loop

import (
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"
)

// DeadLetterLog logs the records a runner dead-letters: a Warn line per
// record with its coordinates (topic, partition, offset) and the error,
// never its key or value, which may hold data the log must not. Lines are
// rate-limited, at most one per Every: the records held back meanwhile are
// counted, and once Every has passed one line gives their count with the
// coordinates and error of the last. Safe for concurrent use.
type DeadLetterLog struct {
	logger *slog.Logger
	msg    string
	every  time.Duration
	now    func() time.Time

	mu      sync.Mutex
	next    time.Time // when the next line may be logged
	held    int       // records not logged since the last line
	last    []any     // the coordinates and error of the last of them
	flusher *time.Timer
}

// DeadLetterLogEvery is how often at most a runner logs a dead letter.
const DeadLetterLogEvery = time.Second

// maxErrorText bounds the error's text in a dead letter's line, in bytes:
// a handler's error may quote the record it failed on.
const maxErrorText = 300

// NewDeadLetterLog returns the log of a runner's dead letters, each line
// with message msg ("eos: dead-lettered an input", say), at most one per
// every.
func NewDeadLetterLog(logger *slog.Logger, msg string, every time.Duration) *DeadLetterLog {
	return &DeadLetterLog{logger: logger, msg: msg, every: every, now: time.Now}
}

// Log notes that the record at topic, partition, offset was dead-lettered
// because of err; attrs are added to its line (the dead-letter topic, say).
func (l *DeadLetterLog) Log(topic string, partition int32, offset int64, err error, attrs ...any) {
	line := append([]any{"topic", topic, "partition", partition, "offset", offset, "err", ErrorText(err)}, attrs...)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Before(l.next) {
		l.held++
		l.last = line
		if l.flusher == nil {
			l.flusher = time.AfterFunc(l.next.Sub(now), l.Flush)
		}
		return
	}
	l.next = now.Add(l.every)
	l.logger.Warn(l.msg, line...)
}

// Flush logs the count of the records held back, if any, at once. Runners
// call it when Run returns; a timer calls it once the records held back
// may be logged.
func (l *DeadLetterLog) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flusher != nil {
		l.flusher.Stop()
		l.flusher = nil
	}
	if l.held == 0 {
		return
	}
	l.logger.Warn(l.msg+" (more, not logged one by one: at most one line per "+l.every.String()+"; the last of them follows)",
		append([]any{"not_logged", l.held}, l.last...)...)
	l.held, l.last = 0, nil
	l.next = l.now().Add(l.every)
}

// ErrorText is err's text for a log line, cut to 300 bytes (at a rune's
// start) with "…" marking the cut.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
