package loop

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaCommits commits to the group in Kafka the offsets past the records
// a database runner applied, once the database committed them (dedup's
// offsets; offsetstore's mirror). A commit that fails (a rebalance in
// progress, a coordinator moving) is kept and tried again at the next
// Commit, which a runner calls every 100 ms at most (internal/consume), after an empty poll too: the
// last batch of a partition that then stays idle is otherwise never
// committed, and the group shows it behind for good. A partition the
// group took is forgotten (Forget, from the revoke and lost callbacks):
// its new owner commits it, and an old commit must not move it back. A
// commit is held while the client is a member other than the one its
// assignment was given to (Assigned, from the assign callback).
// Safe for concurrent use.
type KafkaCommits struct {
	mu      sync.Mutex
	pending map[string]map[int32]*kgo.Record // the last applied record of each partition, not committed yet
	logger  *slog.Logger
	failing bool // the last Commit failed (logged once until one succeeds)
	// member is the member id the client's current assignment was
	// given to (Assigned). A client dropped from the group (stalled
	// past the rebalance timeout) rejoins as a new member without
	// losing its partitions first, and its commits go through under
	// the new id before the new assignment's callbacks run: committing
	// then could move back a partition the group gave to another
	// member, which has nothing left to commit.
	member string
}

// errEarlierMember refuses a commit the client would send under a member
// id other than the one its assignment was given to.
var errEarlierMember = errors.New("the client rejoined the group as a new member; its assignment is not known yet")

// NewKafkaCommits returns an empty set, logging failures to logger.
func NewKafkaCommits(logger *slog.Logger) *KafkaCommits {
	return &KafkaCommits{pending: map[string]map[int32]*kgo.Record{}, logger: logger}
}

// Add notes records applied and committed in the database.
func (k *KafkaCommits) Add(recs ...*kgo.Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range recs {
		parts := k.pending[r.Topic]
		if parts == nil {
			parts = map[int32]*kgo.Record{}
			k.pending[r.Topic] = parts
		}
		if last, ok := parts[r.Partition]; !ok || r.Offset > last.Offset {
			parts[r.Partition] = r
		}
	}
}

// Assigned notes the member the client's current assignment was given
// to; call it from the assignment callback (kgo calls it after every
// rebalance, with nothing new assigned too).
func (k *KafkaCommits) Assigned(cl *kgo.Client) {
	member, _ := cl.GroupMetadata()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.member = member
}

// Forget drops what is pending for parts.
func (k *KafkaCommits) Forget(parts map[string][]int32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			delete(k.pending[t], p)
		}
		if len(k.pending[t]) == 0 {
			delete(k.pending, t)
		}
	}
}

// Pending reports how many partitions have offsets not committed yet.
func (k *KafkaCommits) Pending() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, ps := range k.pending {
		n += len(ps)
	}
	return n
}

// Commit commits what is pending through cl, and keeps it when the commit
// fails (the error is returned, and logged once until a commit succeeds).
// It must not run while cl may rebalance away the partitions it commits:
// under kgo.BlockRebalanceOnPoll, between a poll and AllowRebalance.
func (k *KafkaCommits) Commit(ctx context.Context, cl *kgo.Client, what string) error {
	k.mu.Lock()
	var recs []*kgo.Record
	for _, ps := range k.pending {
		for _, r := range ps {
			recs = append(recs, r)
		}
	}
	k.mu.Unlock()
	if len(recs) == 0 {
		return nil
	}
	k.mu.Lock()
	member := k.member
	k.mu.Unlock()
	// Checked on the request itself: the member id it is sent under
	// is read as it is built, after any rejoin before it.
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		if req.MemberID != member {
			return errEarlierMember
		}
		return nil
	})
	err := cl.CommitRecords(ctx, recs...)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if !k.failing && ctx.Err() == nil {
			k.logger.Warn(what+" failed; retrying at the next poll", "partitions", len(recs), "err", err)
		}
		k.failing = true
		return err
	}
	if k.failing {
		k.logger.Info(what + " succeeded again")
	}
	k.failing = false
	for _, r := range recs {
		if cur := k.pending[r.Topic][r.Partition]; cur == r {
			delete(k.pending[r.Topic], r.Partition) // not if a later record came meanwhile
		}
		if len(k.pending[r.Topic]) == 0 {
			delete(k.pending, r.Topic)
		}
	}
	return nil
}
