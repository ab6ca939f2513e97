package eos_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// endTxnTamperer is a franz-go dialer whose connections tell the client
// that one EndTxn commit failed with UNKNOWN_SERVER_ERROR after the broker
// carried it out: a commit whose outcome the client cannot know, as a
// broker that fails between writing the markers and answering would leave
// it. Everything else passes untouched.
type endTxnTamperer struct {
	commitsBefore atomic.Int32 // EndTxn commits let through before the tampered one
	seen          atomic.Int32 // EndTxn commits seen so far
	tampered      atomic.Bool
	// hold, when set, holds the tampered response before the client
	// reads it: held is closed when it arrives, and the response passes
	// once release is closed.
	hold          bool
	held, release chan struct{}
}

func (d *endTxnTamperer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &tamperedConn{Conn: c, d: d, pending: map[int32]int{}}, nil
}

type tamperedConn struct {
	net.Conn
	d       *endTxnTamperer
	mu      sync.Mutex
	pending map[int32]int // correlation id -> offset of the error code in the response
	// the response being read is the tampered one
	tamper bool
	// the response being read: bytes of it seen, its size, and the
	// error-code offset to rewrite (-1: none)
	pos, size int
	header    [8]byte
	target    int
}

// Write parses each request franz-go writes (one whole request per Write)
// and notes the EndTxn commit to tamper with.
func (c *tamperedConn) Write(p []byte) (int, error) {
	if len(p) >= 12 && binary.BigEndian.Uint16(p[4:6]) == 26 { // EndTxn
		version := int16(binary.BigEndian.Uint16(p[6:8]))
		corr := int32(binary.BigEndian.Uint32(p[8:12]))
		if commit, ok := endTxnCommits(p, version); ok && commit {
			if c.d.seen.Add(1) == c.d.commitsBefore.Load()+1 && c.d.tampered.CompareAndSwap(false, true) {
				offset := 4 + 4 + 4 // size, correlation id, throttle
				if version >= 3 {
					offset++ // the flexible response header's empty tag buffer
				}
				c.mu.Lock()
				c.pending[corr] = offset
				c.mu.Unlock()
			}
		}
	}
	return c.Conn.Write(p)
}

// endTxnCommits reads the committed flag of an EndTxn request frame.
func endTxnCommits(p []byte, version int16) (commit, ok bool) {
	i := 12 // size, api key, version, correlation id
	if len(p) < i+2 {
		return false, false
	}
	clientID := int(int16(binary.BigEndian.Uint16(p[i:])))
	i += 2 + max(clientID, 0)
	flexible := version >= 3
	if flexible {
		i++ // empty request header tag buffer (franz-go sends none)
		n, w := binary.Uvarint(p[i:])
		if w <= 0 {
			return false, false
		}
		i += w + int(n) - 1 // compact transactional id
	} else {
		if len(p) < i+2 {
			return false, false
		}
		i += 2 + int(binary.BigEndian.Uint16(p[i:]))
	}
	i += 8 + 2 // producer id, epoch
	if len(p) <= i {
		return false, false
	}
	return p[i] == 1, true
}

// Read passes responses through, rewriting the error code of the tampered
// EndTxn's response to UNKNOWN_SERVER_ERROR (-1).
func (c *tamperedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	for i := 0; i < n; i++ {
		if c.pos < 8 {
			c.header[c.pos] = p[i]
			if c.pos == 7 {
				c.size = int(binary.BigEndian.Uint32(c.header[:4])) + 4
				corr := int32(binary.BigEndian.Uint32(c.header[4:8]))
				c.mu.Lock()
				off, ok := c.pending[corr]
				delete(c.pending, corr)
				c.mu.Unlock()
				c.target, c.tamper = -1, ok
				if ok {
					c.target = off
				}
				if ok && c.d.hold {
					close(c.d.held)
					<-c.d.release
				}
			}
		} else if c.tamper && (c.pos == c.target || c.pos == c.target+1) {
			p[i] = 0xff
		}
		c.pos++
		if c.pos >= 8 && c.pos == c.size {
			c.pos, c.size = 0, 0
		}
	}
	return n, err
}

// A commit whose outcome is unknown: the broker committed the transaction,
// and the processor was told UNKNOWN_SERVER_ERROR. franz-go retries that as
// an abort and End returns (false, nil), which looks like a rebalance; a
// processor that goes on in the same session rewinds to franz-go's own
// view of the committed offsets, older than the broker's, and copies the
// committed batch again. It must start a new session, which reads the
// offsets from the broker: every input once.
func TestProcessorRestartsWhenACommitsOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")
	const n = 5000
	inputs := k.Seed(in, n)
	tamper := &endTxnTamperer{}
	tamper.commitsBefore.Store(2)
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, copyHandler(out), append(processorOpts(k, group, in, "0"), eos.WithMetrics(metrics),
		eos.MaxRecordsPerCommit(500), eos.ClientOptions(kgo.Dialer(tamper.dial)))...)
	checkTamperedCopy(t, k, p, tamper, metrics, progress, inputs, out)
}

// checkTamperedCopy waits until every input was copied after the tampered
// commit was reported unknown, stops the processor (whatever it copied
// again is committed by then), and checks the fault struck and the output
// holds every input once.
func checkTamperedCopy(t *testing.T, k *integration.KafkaCluster, p *running, tamper *endTxnTamperer, metrics *countingMetrics, progress *counter, inputs []string, out string) {
	t.Helper()
	waitFor(t, 2*time.Minute, "every input to be copied, after the tampered commit was reported unknown", func() bool {
		return progress.n.Load() >= int64(len(inputs)) && strings.Contains(metrics.abortReasons(), "outcome-unknown")
	})
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	if !tamper.tampered.Load() {
		t.Fatal("no EndTxn commit was tampered with; the fault never struck")
	}
	t.Logf("aborts: %s; verifier: %v", metrics.abortReasons(), k.VerifyTopic(inputs, out, verifyTimeout))
}

// The same unknown outcome during a rebalance that takes nothing from the
// processor. Under the cooperative-sticky balancer (franz-go's default)
// every group session ends with OnPartitionsRevoked called with nothing in
// it; a processor that takes that call for a revocation believes the
// unconfirmed commit was a rebalance's abort, skips the broker's offsets,
// rewinds to franz-go's older view and copies the committed batch again.
// Here a second member joins the group, for another topic, while a batch
// is being handled; the batch ends after the rebalance, its commit is
// carried out and reported UNKNOWN_SERVER_ERROR: every input once.
func TestProcessorGuardsAnUnknownOutcomeThroughARebalanceThatTakesNothing(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out, other := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	const n, holdAt = 3000, 1000
	inputs := k.Seed(in, n)
	tamper := &endTxnTamperer{}
	tamper.commitsBefore.Store(1 << 30) // armed below
	var handled atomic.Int64
	var emptyRevokes atomic.Int32
	holding, release := make(chan struct{}), make(chan struct{})
	copyOut := copyHandler(out)
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if handled.Add(1) == holdAt {
			close(holding)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return copyOut(ctx, r)
	}
	onRevoked := func(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
		if len(revoked) == 0 {
			emptyRevokes.Add(1)
		}
	}
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, handler, append(processorOpts(k, group, in, "0"), eos.MaxRecordsPerCommit(500), eos.WithMetrics(metrics),
		eos.ClientOptions(kgo.Dialer(tamper.dial), kgo.OnPartitionsRevoked(onRevoked)))...)
	select {
	case <-holding:
	case <-time.After(time.Minute):
		t.Fatal("the handler never reached the record it holds")
	}
	// The second member subscribes to another topic: the rebalance takes
	// nothing from the processor, whose session ends all the same.
	var joined atomic.Bool
	member := k.Client(kgo.ConsumerGroup(group), kgo.ConsumeTopics(other),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { joined.Store(true) }))
	go func() {
		for ctx := t.Context(); ctx.Err() == nil; {
			member.PollFetches(ctx)
		}
	}()
	waitFor(t, time.Minute, "the second member assigned its topic and the processor's session ended with an empty revoke", func() bool {
		return joined.Load() && emptyRevokes.Load() > 0
	})
	tamper.commitsBefore.Store(tamper.seen.Load()) // the held batch's commit is the tampered one
	close(release)
	checkTamperedCopy(t, k, p, tamper, metrics, progress, inputs, out)
	t.Logf("empty revokes: %d", emptyRevokes.Load())
}

// The same unknown outcome with a revoke that waits while the commit ends:
// franz-go holds a revoke until End returns, then passes it on. A
// processor that reads the revoke after End takes the unconfirmed commit
// for the rebalance's abort and skips the broker's offsets; under a
// cooperative or KIP-848 group the partitions it keeps are never
// re-fetched, so it would copy the committed batch again. Here a second
// member joins an eager group while a batch is handled; the batch's End
// meets the rebalance at its heartbeat, commits all the same (KIP-447),
// and its EndTxn's answer, UNKNOWN_SERVER_ERROR, is held until the group
// loop's revoke waits on the ending transaction. The abort must be
// "outcome-unknown" (the broker's offsets were read), not "rebalance",
// and every input is copied once (issue 43 item 1).
func TestProcessorGuardsAnUnknownOutcomeThroughARevokeWhileItEnds(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(4), k.NewTopic(4)
	group := integration.UniqueName(t, "g")
	const n, holdAt = 4000, 1000
	inputs := k.Seed(in, n)
	tamper := &endTxnTamperer{hold: true, held: make(chan struct{}), release: make(chan struct{})}
	tamper.commitsBefore.Store(1 << 30) // armed below
	var handled atomic.Int64
	holding, releaseHandler := make(chan struct{}), make(chan struct{})
	copyOut := copyHandler(out)
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if handled.Add(1) == holdAt {
			close(holding)
			select {
			case <-releaseHandler:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return copyOut(ctx, r)
	}
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	eager := kgo.Balancers(kgo.RangeBalancer())
	p := startProcessor(t, handler, append(processorOpts(k, group, in, "0"), eos.MaxRecordsPerCommit(500), eos.WithMetrics(metrics),
		eos.ClientOptions(kgo.Dialer(tamper.dial), eager))...)
	select {
	case <-holding:
	case <-time.After(time.Minute):
		t.Fatal("the handler never reached the record it holds")
	}
	tamper.commitsBefore.Store(tamper.seen.Load()) // the held batch's commit is the tampered one
	// A second member joins, holds what it is given without reading or
	// committing, and leaves once assigned.
	var assigned atomic.Bool
	member := k.Client(kgo.ConsumerGroup(group), kgo.ConsumeTopics(in), eager, kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) { assigned.Store(len(parts[in]) > 0) }))
	go func() {
		for ctx := t.Context(); ctx.Err() == nil && !assigned.Load(); {
			pollCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			member.PollFetches(pollCtx)
			cancel()
		}
		member.Close()
	}()
	adm := kadm.NewClient(k.Client())
	waitFor(t, time.Minute, "the second member's join to start a rebalance", func() bool {
		described, err := adm.DescribeGroups(t.Context(), group)
		return err == nil && described[group].State == "PreparingRebalance"
	})
	close(releaseHandler) // the batch ends now, and its heartbeat meets the rebalance
	select {
	case <-tamper.held:
	case <-time.After(time.Minute):
		close(tamper.release)
		t.Fatal("the held batch's EndTxn commit never came (a revoke before End aborts it untried: run again)")
	}
	// The group loop revokes next, and waits on the ending transaction.
	time.Sleep(time.Second)
	close(tamper.release)
	checkTamperedCopy(t, k, p, tamper, metrics, progress, inputs, out)
	if !assigned.Load() {
		t.Error("the second member was never assigned a partition: the rebalance the test needs did not happen")
	}
}
