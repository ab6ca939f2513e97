package eos_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state"
)

// tracing adds a header to every record produced, as kotel's
// traceparent does.
type tracing struct{ topic string }

func (h tracing) OnProduceRecordBuffered(r *kgo.Record) {
	if r.Topic == h.topic {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: bytes.Repeat([]byte("t"), 300)})
	}
}

// A write that fits the changelog by its key and value, but not with the
// headers a producer hook adds to every record (kotel's traceparent),
// is the record's fault once the processor has seen what the hooks add:
// it fails in its handler with state.ErrTooLarge, and the policy
// dead-letters it; the records around it are counted. Before, it passed
// the check, failed at the flush, and restarted the session until Run
// gave up (issue 43 item 9, failing on a0c3743). The same holds for
// headers the hooks add to the updates topic's records alone, with the
// limit the updates topic's (failing on 7d16fbd: only the changelog's
// records were looked at).
func TestAWriteTooLargeWithTheHooksHeadersIsTheRecords(t *testing.T) {
	t.Parallel()
	for _, hooked := range []string{"changelog", "updates"} {
		t.Run("headers on the "+hooked+" topic's records", func(t *testing.T) {
			t.Parallel()
			writeTooLargeWithHeaders(t, hooked)
		})
	}
}

func writeTooLargeWithHeaders(t *testing.T, hooked string) {
	k := integration.Kafka(t)
	in, dlt := k.NewTopic(1), k.NewTopic(1)
	changelog, updates := integration.UniqueName(t, "changelog"), integration.UniqueName(t, "updates")
	compact, limit := "compact", "4096"
	small := map[string]*string{"cleanup.policy": &compact, "max.message.bytes": &limit}
	if hooked == "updates" {
		k.CreateTopic(changelog, 1, map[string]*string{"cleanup.policy": &compact})
		k.CreateTopic(updates, 1, map[string]*string{"max.message.bytes": &limit})
	} else {
		k.CreateTopic(changelog, 1, small)
		k.CreateTopic(updates, 1, nil)
	}
	hookedTopic := map[string]string{"changelog": changelog, "updates": updates}[hooked]
	big := make([]byte, 4096-state.RecordOverhead-10) // fits by key and value alone
	_, _ = crand.Read(big)                            // compression must not shrink it
	cl := k.Client(kgo.DefaultProduceTopic(in))
	var recs []*kgo.Record
	for i := range 20 {
		v := []byte("small")
		if i == 10 {
			v = []byte("big")
		}
		recs = append(recs, &kgo.Record{Key: []byte("k" + strconv.Itoa(i)), Value: v})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		v := []byte("1")
		if string(r.Value) == "big" {
			v = big
		}
		return nil, eos.StateOf(ctx).Put(r.Key, v)
	}
	group := integration.UniqueName(t, "g")
	p := startProcessor(t, h, append(processorOpts(k, group, in, "0"), eos.Changelog(changelog, eos.EmitUpdates(updates)),
		eos.OnHandlerError(eos.DeadLetter(dlt)), eos.ClientOptions(kgo.WithHooks(tracing{topic: hookedTopic})))...)
	deadline := time.Now().Add(time.Minute)
	for len(k.ReadNow(dlt, kgo.ReadCommitted(), 10*time.Second)) < 1 {
		select {
		case <-p.finished:
			t.Fatalf("Run returned %v before the big write was dead-lettered", p.err)
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the write too large with the hooks' headers was not dead-lettered within a minute (health: %+v)", p.p.Health())
		}
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := len(k.ReadAll(changelog, kgo.ReadCommitted(), verifyTimeout)); n != 19 {
		t.Fatalf("%d changelog records, want the 19 small writes", n)
	}
}
