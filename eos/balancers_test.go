package eos_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// Under an eager balancer (range) a member holding nothing at a rebalance
// gets a revoke of nothing, and franz-go's GroupTransactSession latches it
// (as it latches any loss) until the session's next End, dropping every
// later revoke meanwhile. An idle processor ends none, so the latch must
// be cleared by a re-arm after the empty revoke too. Three members, two
// partitions: the third holds nothing; then the first leaves and comes
// back, and the second leaves. After each step every member lists exactly
// what it holds, every partition once, and under range every member that
// stayed saw a revoke of all it held before the step (an eager rebalance
// revokes everything), through the user's own hook. Before, the third
// member's hook never saw its revoke once it had held nothing at a
// rebalance (issue 43 item 2, failing on 3bfa998 under range).
// Cooperative-sticky runs the same steps (its revokes are incremental, so
// only the Health check applies).
func TestAnIdleProcessorSeesEveryRevokeUnderEveryBalancer(t *testing.T) {
	t.Parallel()
	for name, balancer := range map[string]kgo.GroupBalancer{"range": kgo.RangeBalancer(), "cooperative-sticky": kgo.CooperativeStickyBalancer()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			const partitions = 2
			in := k.NewTopic(partitions)
			group := integration.UniqueName(t, "idle-"+name)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			type member struct {
				p    *eos.Processor
				stop context.CancelFunc
				done chan struct{}

				mu      sync.Mutex
				revoked map[int32]bool // by the user's hook, since the last step
			}
			members := make([]*member, 3)
			start := func(i int) {
				txnID, err := eos.StableTransactionalID(group, strconv.Itoa(i))
				if err != nil {
					t.Fatal(err)
				}
				m := &member{done: make(chan struct{}), revoked: map[int32]bool{}}
				taken := func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
					m.mu.Lock()
					defer m.mu.Unlock()
					for _, p := range parts[in] {
						m.revoked[p] = true
					}
				}
				p, err := eos.NewProcessor(func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
					eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID),
					eos.ClientOptions(kgo.Balancers(balancer), kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(5*time.Second),
						kgo.OnPartitionsRevoked(taken), kgo.OnPartitionsLost(taken)))
				if err != nil {
					t.Fatal(err)
				}
				runCtx, stop := context.WithCancel(ctx)
				m.p, m.stop = p, stop
				members[i] = m
				go func() {
					defer close(m.done)
					if err := p.Run(runCtx); err != nil {
						t.Errorf("member %d: Run: %v", i, err)
					}
				}()
			}
			defer func() {
				for _, m := range members {
					if m != nil {
						m.stop()
						<-m.done
					}
				}
			}()
			// before snapshots what each member holds, and forgets the
			// revokes its hook saw.
			before := func() map[int][]int32 {
				held := map[int][]int32{}
				for j, m := range members {
					if m != nil {
						held[j] = m.p.Health().Assigned[in]
						m.mu.Lock()
						clear(m.revoked)
						m.mu.Unlock()
					}
				}
				return held
			}
			// settled waits until the running members' Health lists every
			// partition once between them, and no member one it does not
			// hold (two members listing one partition); under range, until
			// every member that stayed has seen all it held revoked.
			settled := func(step string, held map[int][]int32) {
				t.Helper()
				deadline := time.Now().Add(time.Minute)
				for {
					owner := map[int32]int{}
					last, ok := "", true
					for j, m := range members {
						if m == nil {
							continue
						}
						h := m.p.Health()
						held := slices.Sorted(slices.Values(h.Assigned[in]))
						last += fmt.Sprintf(" member %d: assigned %v, joined %v;", j, held, h.Joined)
						ok = ok && h.Joined
						for _, p := range held {
							if prev, dup := owner[p]; dup {
								last += fmt.Sprintf(" partition %d listed by members %d and %d;", p, prev, j)
								ok = false
							}
							owner[p] = j
						}
					}
					if name == "range" {
						for j, parts := range held {
							if members[j] == nil {
								continue
							}
							members[j].mu.Lock()
							for _, p := range parts {
								if !members[j].revoked[p] {
									last += fmt.Sprintf(" member %d held %d and its hook saw no revoke of it;", j, p)
									ok = false
								}
							}
							members[j].mu.Unlock()
						}
					}
					if ok && len(owner) == partitions {
						t.Logf("%s:%s", step, last)
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("a minute after %s, the members' views disagree with the group:%s", step, last)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			leave := func(i int) {
				members[i].stop()
				<-members[i].done
				members[i] = nil
			}
			for i := range 3 {
				held := before()
				start(i)
				settled(fmt.Sprintf("member %d joined", i), held)
			}
			held := before()
			leave(0)
			settled("member 0 left", held)
			held = before()
			start(0)
			settled("member 0 came back", held)
			held = before()
			leave(1)
			settled("member 1 left", held)
		})
	}
}
