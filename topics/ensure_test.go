package topics_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/topics"
)

func TestEnsureCreatesWhatIsMissingWithItsShape(t *testing.T) {
	k := integration.Kafka(t)
	adm := kadm.NewClient(k.Client())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := integration.UniqueName(t, "ensure")
	existing := k.NewTopic(2)
	spec := topics.Spec{Name: name, Partitions: 3, ReplicationFactor: 1, Configs: map[string]string{"cleanup.policy": "compact"}}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), name) })

	created, err := topics.Ensure(ctx, adm, spec, topics.Spec{Name: existing, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(created, []string{name}) {
		t.Fatalf("created %v, want only %s (the other exists)", created, name)
	}
	details, err := adm.ListTopics(ctx, name)
	if err != nil || len(details[name].Partitions) != 3 {
		t.Fatalf("the created topic has %d partitions (err %v), want 3", len(details[name].Partitions), err)
	}
	rc, err := adm.DescribeTopicConfigs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rc.On(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := ""
	for _, kv := range c.Configs {
		if kv.Key == "cleanup.policy" && kv.Value != nil {
			policy = *kv.Value
		}
	}
	if policy != "compact" {
		t.Fatalf("the created topic has cleanup.policy %q, want compact", policy)
	}
	// A second Ensure finds the same shape and creates nothing.
	if created, err := topics.Ensure(ctx, adm, spec); err != nil || len(created) > 0 {
		t.Fatalf("second Ensure: created %v, err %v; want nothing and no error", created, err)
	}
}

func TestEnsureRefusesATopicOfAnotherShapeAndChangesNothing(t *testing.T) {
	k := integration.Kafka(t)
	adm := kadm.NewClient(k.Client())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	existing := k.NewTopic(4) // cleanup.policy=delete, the broker's default

	_, err := topics.Ensure(ctx, adm, topics.Spec{Name: existing, Partitions: 1, Configs: map[string]string{"cleanup.policy": "compact"}})
	if !errors.Is(err, topics.ErrConflict) {
		t.Fatalf("Ensure = %v, want ErrConflict", err)
	}
	var settings []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if ce, ok := errors.AsType[*topics.ConflictError](e); ok && ce.Topic == existing {
			settings = append(settings, ce.Setting+": "+ce.Have+" not "+ce.Want)
		}
	}
	if !slices.Equal(settings, []string{"partitions: 4 not 1", "cleanup.policy: delete not compact"}) {
		t.Fatalf("conflicts %q, want the partitions and cleanup.policy named with both values", settings)
	}
	if details, err := adm.ListTopics(ctx, existing); err != nil || len(details[existing].Partitions) != 4 {
		t.Fatalf("the topic has %d partitions after Ensure (err %v): it must not be changed", len(details[existing].Partitions), err)
	}
}

func TestEnsureByTwoProcessesAtOnceBothSucceed(t *testing.T) {
	k := integration.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := integration.UniqueName(t, "ensure-race")
	spec := topics.Spec{Name: name, Partitions: 2}
	t.Cleanup(func() { _, _ = kadm.NewClient(k.Client()).DeleteTopics(context.Background(), name) })

	var wg sync.WaitGroup
	results := make([][]string, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = topics.Ensure(ctx, kadm.NewClient(k.Client()), spec) })
	}
	wg.Wait()
	creators := 0
	for i := range results {
		if errs[i] != nil {
			t.Errorf("Ensure %d: %v", i, errs[i])
		}
		creators += len(results[i])
	}
	if creators != 1 {
		t.Errorf("%d of the Ensures say they created the topic, want exactly 1", creators)
	}
}
