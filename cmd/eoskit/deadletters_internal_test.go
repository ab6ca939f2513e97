package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func hdrs(kv ...string) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

// A dead letter from eos goes back to where it was read, one from an
// outbox relay to the topic it was meant for, each with its own headers
// only and the replayed-from header; one the outbox kept no value of, or
// that names no topic, is refused rather than published as something else.
func TestReplayRecordSendsTheRecordWhereItBelongs(t *testing.T) {
	eosLetter := &kgo.Record{Topic: "dlt", Partition: 1, Offset: 7, Key: []byte("k"), Value: []byte("v"),
		Headers: hdrs("region", "north", "eoskit-error", "bad", "eoskit-source-topic", "reports", "eoskit-source-partition", "2", "eoskit-source-offset", "41")}
	outboxLetter := &kgo.Record{Topic: "dlt", Offset: 3, Value: []byte("v"),
		Headers: hdrs("eoskit-outbox-id", "12", "eoskit-outbox-topic", "orders", "eoskit-outbox-error", "no such partition", "region", "south")}
	tooLarge := &kgo.Record{Topic: "dlt", Offset: 4,
		Headers: hdrs("eoskit-outbox-id", "13", "eoskit-outbox-topic", "orders", "eoskit-outbox-error", "too large", "eoskit-outbox-value", "omitted (too large); the record is kept in eoskit_outbox_dead_letters")}
	bare := &kgo.Record{Topic: "dlt", Offset: 5, Value: []byte("v")}
	// Dead letters of inputs whose producers put dead-letter headers of
	// their own, as an earlier eoskit kept them: eos's after the input's,
	// the outbox's before the record's (issue 47 item 8: on 3bfa998 the
	// first was replayed into payments, the second was refused for a
	// value it had).
	forgedEOS := &kgo.Record{Topic: "dlt", Offset: 8, Value: []byte("v"),
		Headers: hdrs("eoskit-source-topic", "payments", "eoskit-error", "bad", "eoskit-source-topic", "reports", "eoskit-source-partition", "2", "eoskit-source-offset", "41")}
	// The earlier relay's own headers first, then the record's, which
	// may carry eos's: an outbox letter reads none of them.
	forgedOldOutbox := &kgo.Record{Topic: "dlt", Offset: 10, Value: []byte("v"),
		Headers: hdrs("eoskit-outbox-id", "15", "eoskit-outbox-topic", "orders", "eoskit-outbox-error", "refused", "eoskit-source-topic", "payments")}
	forgedOutbox := &kgo.Record{Topic: "dlt", Offset: 9, Value: []byte("v"),
		Headers: hdrs("eoskit-outbox-id", "14", "eoskit-outbox-topic", "orders", "eoskit-outbox-error", "no such partition", "eoskit-outbox-topic", "payments", "eoskit-outbox-value", "blocked")}

	for _, tc := range []struct {
		in            *kgo.Record
		toTopic, want string // want: the topic, or the error's text
		wantHeaders   string
	}{
		{eosLetter, "", "reports", "region,eoskit-replayed-from"},
		{eosLetter, "retry", "retry", "region,eoskit-replayed-from"},
		{outboxLetter, "", "orders", "region,eoskit-replayed-from"},
		{tooLarge, "orders", "holds no value", ""},
		{bare, "", "names no topic", ""},
		{bare, "retry", "retry", "eoskit-replayed-from"},
		{forgedEOS, "", "reports", "eoskit-replayed-from"},
		{forgedOutbox, "", "orders", "eoskit-replayed-from"},
		{forgedOldOutbox, "", "orders", "eoskit-replayed-from"},
	} {
		out, err := replayRecord(tc.in, tc.toTopic)
		if tc.wantHeaders == "" {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("replayRecord(@%d, %q) = %v, %v; want an error saying %q", tc.in.Offset, tc.toTopic, out, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("replayRecord(@%d, %q): %v", tc.in.Offset, tc.toTopic, err)
			continue
		}
		var keys []string
		for _, h := range out.Headers {
			keys = append(keys, h.Key)
		}
		if out.Topic != tc.want || string(out.Value) != string(tc.in.Value) || strings.Join(keys, ",") != tc.wantHeaders {
			t.Errorf("replayRecord(@%d, %q) = topic %s, value %q, headers %v; want %s, the value, %s", tc.in.Offset, tc.toTopic, out.Topic, out.Value, keys, tc.want, tc.wantHeaders)
		}
	}
}
