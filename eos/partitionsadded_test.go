package eos_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// Keyed state lives per input partition: partitions added to the input
// move keys to partitions whose stores never counted them, and a count
// would silently start again at zero (the changelog has no partition for
// them either). A stateful processor stops instead, once the group sees
// the new partitions (at a metadata refresh), with a *eoskit.ConfigError naming the
// input, its partitions and the changelog's; nothing of the new
// partitions is counted (issue 43's fault model: a topic's life).
func TestPartitionsAddedToTheInputStopAStatefulProcessor(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(2), k.NewTopic(2)
	changelog := newChangelog(t, k, 2)
	group := integration.UniqueName(t, "g")
	seedReports(t, k, in, 2000)
	p := startProcessor(t, eos.Count(), append(statefulOpts(k, group, in, changelog, updates, "0"),
		// The group sees new partitions at a metadata refresh (kgo's
		// MetadataMaxAge, 5 minutes by default).
		eos.ClientOptions(append(testClientOpts(), kgo.MetadataMinAge(time.Second), kgo.MetadataMaxAge(2*time.Second))...))...)
	waitFor(t, 2*time.Minute, "the processor to count", func() bool { return len(p.p.State().Partitions()) == 2 })
	if _, err := k.Admin.CreatePartitions(context.Background(), 1, in); err != nil {
		t.Fatal(err)
	}
	seedReports(t, k, in, 2000)
	err := p.wait(t, 2*time.Minute)
	var cerr *eoskit.ConfigError
	if !errors.As(err, &cerr) || !strings.Contains(err.Error(), in) || !strings.Contains(err.Error(), "3 partitions") {
		t.Fatalf("Run returned %v; want a *eoskit.ConfigError naming %s and its 3 partitions", err, in)
	}
	t.Logf("Run returned %v", err)
	hwm, _ := endOffsets(t, k.Admin, changelog)
	if hwm < 0 {
		t.Fatal("unreadable changelog")
	}
}
