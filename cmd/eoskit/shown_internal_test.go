package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// Names the command prints come from the cluster and the database, where
// anyone who may write a header, name a group or a transactional id put
// them: a terminal escape among them is shown quoted, never sent to the
// operator's terminal. Before, they were printed raw (issue 47 item 11,
// failing on a0c3743).
func TestTextOutputShowsNoTerminalEscapes(t *testing.T) {
	const evil = "g\x1b]0;pwned\x07\x1b[2J"
	var buf bytes.Buffer
	o := textOutput{&buf}
	o.tableLetters([]deadletter.Row{{ID: 1, Group: evil, Topic: evil, Error: evil}})
	o.topicLetters([]topicLetter{{Source: evil, Error: evil}})
	o.hangs([]txnscan.Hang{{DescribedProducer: kadm.DescribedProducer{Topic: evil}, TransactionalID: evil, Evidence: evil}}, 1)
	o.described(&description{Coordinator: kadm.DescribedTransaction{TxnID: evil}, Open: []openPartition{{DescribedProducer: kadm.DescribedProducer{Topic: evil}}}})
	o.closed(&closing{Hang: txnscan.Hang{DescribedProducer: kadm.DescribedProducer{Topic: evil}, Evidence: evil}})
	if out := buf.String(); strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("the text output holds terminal escapes:\n%q", out)
	}
}
