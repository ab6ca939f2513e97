package eos_test

import (
	"testing"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// A table topic deleted and created again (tableCreatedAgain) on the real
// broker, whose deletion, topic IDs and metadata are Kafka's own, under
// range (eager: every partition revoked at the session restart),
// cooperative-sticky and KIP-848's consumer protocol: Run refuses it within 30 s, nothing joined
// with the new topic's records, and so does a processor starting on that
// state.
func TestATableCreatedAgainIsRefusedUnderEachRebalanceProtocol(t *testing.T) {
	t.Parallel()
	underEachRebalanceProtocol(t, func(t *testing.T, k *integration.KafkaCluster, name string, protocol eos.ProcessorOption) {
		cases, joined, dead := k.NewTopic(3), k.NewTopic(3), k.NewTopic(3)
		regions := integration.UniqueName(t, "regions")
		k.CreateTopic(regions, 3, nil)
		changelog := newChangelog(t, k, 3)
		group := integration.UniqueName(t, "recreated-"+name)
		tableCreatedAgain(t, recreatedBed{brokers: k.Brokers, cases: cases, regions: regions, joined: joined, group: group,
			opts: func(table *eos.Table) []eos.ProcessorOption {
				return append(processorOpts(k, group, cases, "0"), protocol, eos.Logger(testLogger(t)), eos.ClientOptions(testClientOpts()...),
					eos.CommitInterval(20*time.Millisecond), eos.MaxRecordsPerCommit(17), eos.OnHandlerError(eos.DeadLetter(dead)),
					eos.WithTables(table), eos.Changelog(changelog))
			}})
	})
}
