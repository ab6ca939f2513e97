package eos_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

// State().Lookup finds a key's partition itself, as the input's producer
// placed it, and answers its committed value; before Run knows the
// input's partitions it answers ErrNotHeld, not an absent key.
func TestLookupFindsTheKeysPartition(t *testing.T) {
	brokers := groupedCluster(t) // three partitions
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed := reportsClient(t, brokers)
	want := map[string]int{}
	for i := range 90 {
		key := "region-" + strconv.Itoa(i%9)
		want[key]++
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(key)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("lookup"), eos.Topics("reports"), eos.TransactionalID("lookup"),
		eos.CommitInterval(20*time.Millisecond), eos.Logger(testLogger(t)), eos.Changelog("lookup-changelog", eos.CreateChangelog()))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.State().Lookup([]byte("region-1")); !errors.Is(err, eos.ErrNotHeld) {
		t.Fatalf("Lookup before Run: %v, want ErrNotHeld", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	adm := kadm.NewClient(seed)
	for {
		offsets, err := adm.FetchOffsets(ctx, "lookup")
		var at int64
		offsets.Each(func(o kadm.OffsetResponse) { at += o.At })
		if err == nil && at == 90 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the processor did not commit the 90 reports")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for key, n := range want {
		v, ok, err := p.State().Lookup([]byte(key))
		if err != nil || !ok || string(v) != strconv.Itoa(n) {
			t.Errorf("Lookup(%s) = %q, %v, %v; want %d", key, v, ok, err, n)
		}
		part, err := p.State().PartitionOf([]byte(key))
		if got, _, _ := p.State().Get(part, []byte(key)); err != nil || string(got) != strconv.Itoa(n) {
			t.Errorf("Get(PartitionOf(%s)=%d) = %q, %v", key, part, got, err)
		}
	}
	if _, ok, err := p.State().Lookup([]byte("nowhere")); ok || err != nil {
		t.Errorf("Lookup of a key never counted: %v, %v; want none, no error", ok, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
