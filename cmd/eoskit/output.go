package main

import (
	"encoding/json"
	"io"

	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// output prints results as text or JSON.
type output interface {
	hangs(hs []txnscan.Hang, looked int)
	described(*description)
	closed(*closing)
	tableLetters([]deadletter.Row)
	topicLetters([]topicLetter)
	replayed(n, passed int, how string)
}

type textOutput struct{ w io.Writer }

type jsonOutput struct{ w io.Writer }

func (o jsonOutput) print(v any) {
	enc := json.NewEncoder(o.w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// nonNil makes an empty result print as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
