package offsetstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
)

// A batch handler that validates its records before writing them names
// the first bad one with Reject: the runner then parks it (under
// DeadLetter) or stops on it (under Stop) without searching the batch,
// inside the batch's one transaction, and runs the handler again on the
// records before it and after it.
func ExampleReject() {
	handler := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, rec := range recs {
			if !json.Valid(rec.Value) {
				return offsetstore.Reject(rec, errors.New("not JSON"))
			}
		}
		// ... write recs with tx ...
		return nil
	}

	recs := []*kgo.Record{
		{Topic: "orders", Offset: 41, Value: []byte(`{"id": 1}`)},
		{Topic: "orders", Offset: 42, Value: []byte(`{"id": `)},
	}
	err := handler(context.Background(), nil, recs)
	var rej *offsetstore.RejectError
	if errors.As(err, &rej) {
		fmt.Printf("rejected %s@%d: %v\n", rej.Record.Topic, rej.Record.Offset, rej.Err)
	}
	// Output: rejected orders@42: not JSON
}
