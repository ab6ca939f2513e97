package integration

import (
	"bytes"
	"sync"
)

// LogBuffer is a log sink that the goroutines of a runner under test may
// write to at once (slog.NewTextHandler(buf, nil)), read back by the test.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
