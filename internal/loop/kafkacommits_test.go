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
	k.Assigned(cl) // as the assign callback does
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

// A member stalled mid-batch past the rebalance timeout is dropped from
// the group, and its client rejoins as a new member still holding the
// stalled batch: until its new assignment's callbacks run (held by
// BlockRebalanceOnPoll), the batch's commit would go through under the new
// member id and move the partitions back below what their new owner
// committed, which then has nothing left to commit. Commit holds what was
// assigned to an earlier member until the assignment of the current one;
// the revoke that comes with it forgets what is no longer this member's.
func TestKafkaCommitsNeverCommitsAnEarlierMembersBatch(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "reports"), kfake.GroupMinSessionTimeout(500*time.Millisecond))
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
	produce := func() {
		for p := range int32(2) {
			for range 3 {
				if err := seed.ProduceSync(ctx, &kgo.Record{Topic: "reports", Partition: p, Value: []byte("r")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	member := func(id string) (*kgo.Client, *KafkaCommits) {
		k := NewKafkaCommits(slog.New(slog.DiscardHandler))
		forget := func(_ context.Context, _ *kgo.Client, parts map[string][]int32) { k.Forget(parts) }
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ClientID(id), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("reports"),
			kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(200*time.Millisecond), kgo.RebalanceTimeout(time.Second),
			kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, _ map[string][]int32) { k.Assigned(cl) }),
			kgo.OnPartitionsRevoked(forget), kgo.OnPartitionsLost(forget))
		if err != nil {
			t.Fatal(err)
		}
		return cl, k
	}
	// round is a runner's loop once: poll, the batch's work, commit.
	round := func(cl *kgo.Client, k *KafkaCommits) {
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		recs := cl.PollRecords(pctx, 0).Records()
		pcancel()
		time.Sleep(500 * time.Millisecond) // the batch's work, with the rebalance held
		k.Add(recs...)
		_ = k.Commit(ctx, cl, "test commit")
		cl.AllowRebalance()
	}

	produce()
	zombie, zk := member("zombie")
	defer zombie.CloseAllowingRebalance()
	for n := 0; n < 6; {
		recs := zombie.PollRecords(ctx, 0).Records()
		if ctx.Err() != nil {
			t.Fatalf("the zombie polled %d of 6 records: %v", n, ctx.Err())
		}
		n += len(recs)
		zk.Add(recs...)
		if n < 6 {
			zombie.AllowRebalance()
		}
	}
	// The zombie stalls with its batch (offsets 0-2 of each partition)
	// uncommitted; a second member joins, and once the zombie is dropped
	// it takes both partitions and commits them to their end.
	produce()
	owner, ok := member("owner")
	defer owner.CloseAllowingRebalance()
	adm := kadm.NewClient(seed)
	committed := func() (int64, int64) {
		offsets, err := adm.FetchOffsets(ctx, "g")
		if err != nil {
			return -1, -1
		}
		o0, _ := offsets.Lookup("reports", 0)
		o1, _ := offsets.Lookup("reports", 1)
		return o0.At, o1.At
	}
	for {
		round(owner, ok)
		if o0, o1 := committed(); o0 == 6 && o1 == 6 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the second member never committed both partitions")
		}
	}
	// The zombie wakes, commits its batch and goes on, beside the owner.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				round(owner, ok)
			}
		}
	}()
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		round(zombie, zk)
	}
	close(stop)
	<-done
	if o0, o1 := committed(); o0 != 6 || o1 != 6 {
		t.Fatalf("committed offsets %d and %d after the zombie woke; want 6 and 6 (what the group read)", o0, o1)
	}
}
