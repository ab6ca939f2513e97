package kafkatokafka_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/patterns/kafkatokafka"
)

// The handler alone, without a broker: one report in, the same report out
// on the feed topic, keyed by its region.
func ExampleForward() {
	out, err := kafkatokafka.Forward("dashboard-feed")(context.Background(), &kgo.Record{Value: []byte("r7|north|4")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s key=%s value=%s\n", out[0].Topic, out[0].Key, out[0].Value)
	// Output: dashboard-feed key=north value=r7|north|4
}
