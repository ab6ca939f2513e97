package producerresume_test

import (
	"context"
	"log"

	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/producerresume"
)

// The north region's source, the only writer of partition 0: it goes on
// after the last report the partition holds, and writes each of the rest
// once. It needs a broker, so it is compiled but not run by go test.
func ExampleProducer_Send() {
	ctx := context.Background()
	p, err := producerresume.New(producerresume.Config{Brokers: []string{"localhost:9092"}, Topic: "case-reports", Partition: 0})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	last, err := p.Last(ctx)
	if err != nil {
		log.Fatal(err)
	}
	reports := []dashboard.Report{{ID: "n1", Region: "north", Cases: 3}, {ID: "n2", Region: "north", Cases: 5}}
	next := 0 // the first report not written before a restart
	for i, rep := range reports {
		if rep.ID == last {
			next = i + 1
		}
	}
	for _, rep := range reports[next:] {
		if err := p.Send(ctx, rep); err != nil {
			log.Fatal(err)
		}
	}
}
