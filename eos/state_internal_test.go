package eos

import (
	"math"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A state record's limit on a topic is the smallest of the producer's
// batch limit there and what a produce request leaves for the batch.
func TestStateRecordLimit(t *testing.T) {
	cl, err := kgo.NewClient(kgo.ClientID("client"), kgo.TransactionalID("txn"), kgo.BrokerMaxWriteBytes(5000),
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if topic == "small" {
				return 2000
			}
			return 4096
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// franz-go's count: the request header (14 bytes and the client id),
	// the produce fields (13 and the transactional id), one topic's and
	// one partition's (14 and the topic's name).
	requestMax := produceRequestMax(cl)
	if want := 5000 - 14 - len("client") - 13 - len("txn") - 14; requestMax != want {
		t.Fatalf("produceRequestMax = %d, want %d", requestMax, want)
	}
	batchMax, _ := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	for _, c := range []struct {
		cfg   stateConfig
		topic string
		want  int
	}{
		{stateConfig{}, "t", math.MaxInt32},
		{stateConfig{batchMax: batchMax}, "small", 2000},
		{stateConfig{batchMax: batchMax, requestMax: requestMax}, "small", 2000},
		{stateConfig{requestMax: requestMax}, "updates", requestMax - len("updates")},
		{stateConfig{batchMax: func(string) int32 { return 1 << 20 }, requestMax: requestMax}, "updates", requestMax - len("updates")},
	} {
		if got := c.cfg.recordLimit(c.topic); got != c.want {
			t.Errorf("recordLimit(%q) with batch limit %v and request limit %d = %d, want %d", c.topic, c.cfg.batchMax != nil, c.cfg.requestMax, got, c.want)
		}
	}
}
