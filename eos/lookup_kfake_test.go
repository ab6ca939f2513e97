package eos_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
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
		if i%10 == 9 {
			key = "zone-" + strconv.Itoa(i%4)
		}
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
		// The group's offsets show a commit as it ends; the stores take
		// its writes just after (the processor applies them once End
		// returned): wait for the view to hold every key too.
		viewed := 0
		for key := range want {
			if _, ok, err := p.State().Lookup([]byte(key)); ok && err == nil {
				viewed++
			}
		}
		if err == nil && at == 90 && viewed == len(want) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the processor did not commit the 90 reports (%d committed), or its view holds %d of %d keys", at, viewed, len(want))
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

	// Prefix and Scan read the keys of a range alone, each partition's
	// in key order, never a reserved key.
	scanned := func(scan func(fn func(int32, []byte, []byte) bool) error) map[string]string {
		got := map[string]string{}
		last := map[int32]string{}
		if err := scan(func(part int32, k, v []byte) bool {
			if string(k) <= last[part] {
				t.Errorf("partition %d: key %q after %q", part, k, last[part])
			}
			last[part] = string(k)
			got[string(k)] = string(v)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	regions := scanned(func(fn func(int32, []byte, []byte) bool) error { return p.State().Prefix([]byte("region-"), fn) })
	middle := scanned(func(fn func(int32, []byte, []byte) bool) error {
		return p.State().Scan([]byte("region-3"), []byte("region-6"), fn)
	})
	for key, n := range want {
		r, inRegions := regions[key]
		m, inMiddle := middle[key]
		isRegion := strings.HasPrefix(key, "region-")
		isMiddle := isRegion && key >= "region-3" && key < "region-6"
		switch {
		case inRegions != isRegion || (isRegion && r != strconv.Itoa(n)):
			t.Errorf("Prefix(region-): %s = %q (listed %t)", key, r, inRegions)
		case inMiddle != isMiddle || (isMiddle && m != strconv.Itoa(n)):
			t.Errorf("Scan(region-3, region-6): %s = %q (listed %t)", key, m, inMiddle)
		}
	}
	if len(regions) != 9 || len(middle) != 3 {
		t.Errorf("Prefix(region-) listed %d keys, want 9; Scan(region-3, region-6) %d, want 3", len(regions), len(middle))
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
