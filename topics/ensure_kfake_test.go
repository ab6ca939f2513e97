package topics_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/topics"
)

// Ensure waits for a topic it created to show in the broker's metadata,
// not in its client's metadata cache, which kadm reads for up to
// MetadataMinAge (5 s by default, two minutes here) and which holds the
// topic as missing from Ensure's own look-up before creating it. Before
// the fix every processor creating its changelog waited out the cache
// (5 s of each start); with this client's cache, Ensure failed after
// WaitVisible.
func TestEnsureWaitsForTheBrokerNotTheMetadataCache(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.MetadataMinAge(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	created, err := topics.Ensure(ctx, kadm.NewClient(cl), topics.Spec{Name: "fresh", Partitions: 3})
	if err != nil || !slices.Equal(created, []string{"fresh"}) {
		t.Fatalf("Ensure = %v, %v; want the topic created and seen", created, err)
	}
}
