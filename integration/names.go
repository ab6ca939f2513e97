package integration

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"testing"
)

var (
	unsafeTopicChars = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)
	unsafeIdentChars = regexp.MustCompile(`[^a-zA-Z0-9_]+`)
)

// UniqueName returns prefix joined with the test's name and a random suffix,
// safe as a Kafka topic, group or transactional id, so that tests sharing a
// broker never meet, and a name found in a broker's log leads to its test.
func UniqueName(tb testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafeTopicChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 120 {
		name = name[len(name)-120:]
	}
	return prefix + "-" + name + "-" + hex.EncodeToString(b[:])
}
