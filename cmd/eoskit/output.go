package main

import (
	"encoding/json"
	"io"
	"strconv"
	"unicode"

	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/txnscan"
	"github.com/eoskit/eoskit/outbox"
)

// output prints results as text or JSON.
type output interface {
	hangs(hs []txnscan.Hang, looked int)
	described(*description)
	closed(*closing)
	tableLetters([]deadletter.Row)
	topicLetters([]topicLetter)
	outboxLetters([]outbox.DeadLetterRow)
	replayed(n, passed int, how string)
}

type textOutput struct{ w io.Writer }

type jsonOutput struct{ w io.Writer }

func (o jsonOutput) print(v any) {
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// shown is a name the cluster or the database gave (a topic, a group, a
// transactional id, a header's text), as the text output prints it:
// quoted, Go's way, when it holds anything but printable characters, so
// that whoever named it cannot send the operator's terminal escapes.
func shown(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			q := strconv.Quote(s)
			return q
		}
	}
	return s
}

// nonNil makes an empty result print as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
