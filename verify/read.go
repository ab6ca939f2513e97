package verify

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadRawTopic reads every record of topic, read_uncommitted and with
// control records (transaction markers), once the topic is settled (see
// [ReadTopicWith]): what [AbortedPositions] takes.
func ReadRawTopic(ctx context.Context, brokers []string, topic string, timeout time.Duration) ([]*kgo.Record, error) {
	return ReadTopicWith(ctx, connOpts(brokers), topic, kgo.ReadUncommitted(), true, true, timeout)
}

// ReadTopic reads every record of topic at level, up to its end (for
// read_committed, its last stable offset); settled first waits until no
// transaction is open on it (every partition's last stable offset at its
// high watermark), so that a reader of a finished run sees its final
// state (see [ReadTopicWith]). It reads to the ends it finds once: what a
// writer still running adds after that is not read.
func ReadTopic(ctx context.Context, brokers []string, topic string, level kgo.IsolationLevel, settled bool, timeout time.Duration) ([]*kgo.Record, error) {
	return ReadTopicWith(ctx, connOpts(brokers), topic, level, settled, false, timeout)
}

// ReadTopicWith is [ReadTopic] over a client built with conn (seed brokers,
// TLS, SASL), keeping control records when keepControl is set. It gives
// up after timeout, with an error naming the topic and what it waited for.
func ReadTopicWith(ctx context.Context, conn []kgo.Opt, topic string, level kgo.IsolationLevel, settled, keepControl bool, timeout time.Duration) ([]*kgo.Record, error) {
	var out []*kgo.Record
	err := EachRecord(ctx, conn, topic, level, settled, keepControl, timeout, func(r *kgo.Record) bool {
		out = append(out, r)
		return true
	})
	return out, err
}

// EachRecord is [ReadTopicWith] that hands each record to fn as it is
// read instead of keeping them: a reader of a large topic holds one
// fetch at a time. fn returning false ends the read early, without error.
func EachRecord(ctx context.Context, conn []kgo.Opt, topic string, level kgo.IsolationLevel, settled, keepControl bool, timeout time.Duration, fn func(*kgo.Record) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	admCl, err := kgo.NewClient(conn...)
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)

	if settled {
		if err := waitSettled(ctx, adm, topic); err != nil {
			return err
		}
	}
	listEnds := adm.ListEndOffsets
	if level == kgo.ReadCommitted() {
		listEnds = adm.ListCommittedOffsets
	}
	ends, err := listEnds(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("read %s: list end offsets: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("read %s: list start offsets: %w", topic, err)
	}

	// next[p] is the offset ReadTopic has read up to; partition p is done
	// when it reaches the end. Control records are kept so that a partition
	// ending in a commit or abort marker still reaches its end.
	next := map[int32]int64{}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		next[o.Partition] = 0
	})
	starts.Each(func(o kadm.ListedOffset) { next[o.Partition] = o.Offset })
	pending := 0
	for p := range end {
		if next[p] < end[p] {
			pending++
		}
	}
	if pending == 0 {
		return nil
	}

	cl, err := kgo.NewClient(append(slices.Clip(conn),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()

	for pending > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("read %s: %d partitions not read to their end (read up to %v of %v): %w",
				topic, pending, next, end, ctx.Err())
		}
		var fetchErr error
		fetches.EachError(func(_ string, _ int32, err error) { fetchErr = err })
		if fetchErr != nil {
			return fmt.Errorf("read %s: %w", topic, fetchErr)
		}
		stop := false
		fetches.EachRecord(func(r *kgo.Record) {
			if stop || r.Offset >= end[r.Partition] {
				return
			}
			wasPending := next[r.Partition] < end[r.Partition]
			next[r.Partition] = r.Offset + 1
			if wasPending && next[r.Partition] >= end[r.Partition] {
				pending--
			}
			if (keepControl || !r.Attrs.IsControl()) && !fn(r) {
				stop = true
			}
		})
		if stop {
			return nil
		}
	}
	return nil
}

// waitSettled returns once every partition's last stable offset equals its
// high watermark, that is once no transaction on topic is still undecided.
func waitSettled(ctx context.Context, adm *kadm.Client, topic string) error {
	var lso, hwm kadm.ListedOffsets
	for {
		var err error
		if hwm, err = adm.ListEndOffsets(ctx, topic); err == nil {
			err = hwm.Error()
		}
		if err == nil {
			if lso, err = adm.ListCommittedOffsets(ctx, topic); err == nil {
				err = lso.Error()
			}
		}
		if err == nil && offsetsEqual(lso, hwm) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("read %s: a transaction is still open (last stable offsets %v, high watermarks %v; last error %v): %w",
				topic, lso.Offsets(), hwm.Offsets(), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func offsetsEqual(a, b kadm.ListedOffsets) bool {
	n, equal := 0, true
	b.Each(func(o kadm.ListedOffset) {
		n++
		if other, ok := a.Lookup(o.Topic, o.Partition); !ok || other.Offset != o.Offset {
			equal = false
		}
	})
	return n > 0 && equal
}

func connOpts(brokers []string) []kgo.Opt { return []kgo.Opt{kgo.SeedBrokers(brokers...)} }
