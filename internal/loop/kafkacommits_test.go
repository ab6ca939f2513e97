package loop

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A commit the coordinator refuses (a rebalance in progress) is kept and
// goes through at the next Commit, with nothing new to add: the last
// batch of a partition that stays idle is committed all the same. A
// partition forgotten (revoked) is not committed.
func TestKafkaCommitsRetriesARefusedCommit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	for p := range int32(2) {
		for range 3 {
			if err := seed.ProduceSync(ctx, &kgo.Record{Topic: "reports", Partition: p, Value: []byte("r")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("reports"),
		kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(recs) < 6 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("polled %d of 6 records: %v", len(recs), err)
		}
		recs = append(recs, fs.Records()...)
	}

	refused := 0
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		refused++
		r := req.(*kmsg.OffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.RebalanceInProgress.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	k := NewKafkaCommits(slog.New(slog.DiscardHandler))
	k.Add(recs...)
	if err := k.Commit(ctx, cl, "test commit"); err == nil || refused != 1 {
		t.Fatalf("first Commit = %v after %d refusals; want the refusal", err, refused)
	}
	if k.Pending() != 2 {
		t.Fatalf("%d partitions pending after the refusal, want both kept", k.Pending())
	}
	k.Forget(map[string][]int32{"reports": {1}}) // revoked meanwhile
	if err := k.Commit(ctx, cl, "test commit"); err != nil || k.Pending() != 0 {
		t.Fatalf("second Commit = %v, %d pending; want it through", err, k.Pending())
	}
	offsets, err := kadm.NewClient(seed).FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offsets.Lookup("reports", 0); o.At != 3 {
		t.Fatalf("partition 0 committed at %d, want 3 (past its last record)", o.At)
	}
	if o, ok := offsets.Lookup("reports", 1); ok && o.At >= 0 {
		t.Fatalf("partition 1, forgotten, committed at %d; want nothing", o.At)
	}
}
