package deadletter

import (
	"testing"
	"unicode/utf8"
)

// Text makes any error text one that PostgreSQL's text takes: valid UTF-8
// without NUL, each offending byte or run of bytes a U+FFFD, the rest kept.
func TestTextIsValidForPostgreSQL(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                 "plain",
		"zahlung-ü":             "zahlung-ü",
		"nul\x00here":           "nul\uFFFDhere",
		"\x00\x00":              "\uFFFD\uFFFD",
		"bad \xff\xfe end":      "bad \uFFFD end",
		"refused\x00 m3 \xff x": "refused\uFFFD m3 \uFFFD x",
		"":                      "",
	} {
		got := Text(in)
		if got != want || !utf8.ValidString(got) {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}
