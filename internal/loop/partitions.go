package loop

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ByPartition splits a poll's records into one batch per partition, each
// in offset order, in the order the partitions first appear.
func ByPartition(recs []*kgo.Record) [][]*kgo.Record {
	type tp struct {
		topic     string
		partition int32
	}
	var batches [][]*kgo.Record
	at := map[tp]int{}
	for _, r := range recs {
		k := tp{r.Topic, r.Partition}
		i, ok := at[k]
		if !ok {
			i = len(batches)
			at[k] = i
			batches = append(batches, nil)
		}
		batches[i] = append(batches[i], r)
	}
	return batches
}

// Each runs fn on every batch, up to n at once, and returns once all
// returned, with their errors in the batches' order.
func Each(n int, batches [][]*kgo.Record, fn func([]*kgo.Record) error) []error {
	errs := make([]error, len(batches))
	slots := make(chan struct{}, max(1, n))
	var wg sync.WaitGroup
	for i, batch := range batches {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			errs[i] = fn(batch)
		}()
	}
	wg.Wait()
	return errs
}
