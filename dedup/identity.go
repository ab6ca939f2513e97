package dedup

import (
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
)

// IDHeader is the record header [Stamp] writes the message id to, and the
// header [HeaderID] reads by default.
const IDHeader = "eoskit-id"

// Stamp gives r a unique message id in its [IDHeader] header, unless it has
// one already, and returns r. Call it once where the message originates,
// before the first produce attempt: the id then travels with every retry
// and every replay of the same message, which is what lets a consumer
// recognise the copies. Stamping again at each retry would defeat it.
//
// The id is a UUIDv7 (time-ordered, so that the processed-ids index stays
// compact).
func Stamp(r *kgo.Record) *kgo.Record {
	for _, h := range r.Headers {
		if h.Key == IDHeader && len(h.Value) > 0 {
			return r
		}
	}
	id, err := uuid.NewV7()
	if err != nil { // only when the system's random source fails
		id = uuid.New()
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: IDHeader, Value: []byte(id.String())})
	return r
}

// IDFunc extracts a message's unique id. ok is false when the record has
// none; the consumer's [MissingIDPolicy] then decides.
type IDFunc func(r *kgo.Record) (id string, ok bool)

// HeaderID reads the id from the header with the given name (the last one,
// if it repeats). HeaderID(IDHeader) reads what [Stamp] wrote.
func HeaderID(name string) IDFunc {
	return func(r *kgo.Record) (string, bool) {
		for i := len(r.Headers) - 1; i >= 0; i-- {
			if h := r.Headers[i]; h.Key == name && len(h.Value) > 0 {
				return string(h.Value), true
			}
		}
		return "", false
	}
}

// KeyID uses the record key as the id: right when each key names one
// message (an order id, a payment id), wrong when a key names an entity
// that many messages update.
func KeyID() IDFunc {
	return func(r *kgo.Record) (string, bool) {
		if len(r.Key) == 0 {
			return "", false
		}
		return string(r.Key), true
	}
}

// MissingIDPolicy is what the consumer does with a record that has no id.
type MissingIDPolicy int8

const (
	// RejectMissingID stops the consumer with an error wrapping
	// [ErrMissingID] that names the record's topic, partition and offset,
	// before anything of its batch is applied. This is the default: a
	// record that can not be deduplicated is a producer bug to fix.
	RejectMissingID MissingIDPolicy = iota
	// TreatAsUnique applies the record without claiming an id: it is
	// processed at least once, and again on every redelivery.
	TreatAsUnique
)
