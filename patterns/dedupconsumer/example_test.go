package dedupconsumer_test

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// The producers' side of the pattern: a report is stamped with its message
// id once, and a send whose outcome is unknown resends that same record,
// id included, so that the consumer counts it once. It needs a broker, so
// it is compiled but not run by go test.
func Example_producer() {
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers("localhost:9092"))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	rec := dedup.Stamp(dashboard.Report{ID: "r7", Region: "north", Cases: 4}.Record("case-reports"))
	for attempt := 1; ; attempt++ {
		err := cl.ProduceSync(ctx, rec).FirstErr()
		if err == nil {
			return
		}
		if attempt == 3 {
			log.Fatal(err)
		}
		// The same rec again: a copy with a fresh id would count twice.
	}
}
