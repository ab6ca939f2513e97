// Package authz turns a broker's refusal for want of an ACL into an error
// that names the permission to grant. eoskit's runners end Run with it
// instead of retrying what can never succeed: franz-go retries a refused
// group join or topic read forever, reporting each refusal as a fetch
// error.
package authz

import (
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Refused reports whether err is a refusal for want of an ACL.
func Refused(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.GroupAuthorizationFailed) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed)
}

// Write names what a refused transactional write needs: Write on the
// topic, on the transactional id, Read on the group whose offsets the
// transaction commits, or (an idempotent producer on a broker before 2.8)
// IdempotentWrite on the cluster. It returns nil when err is no refusal.
func Write(topic, txnID, group string, err error) error {
	switch {
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return &eoskit.AuthorizationError{Permission: "Write on transactional id " + txnID, Err: err}
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return &eoskit.AuthorizationError{Permission: "Write on topic " + topic, Err: err}
	case errors.Is(err, kerr.GroupAuthorizationFailed) && group != "":
		return &eoskit.AuthorizationError{Permission: "Read on group " + group, Err: err}
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		return &eoskit.AuthorizationError{Permission: "Read on the group whose offsets the transaction commits", Err: err}
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return &eoskit.AuthorizationError{Permission: "IdempotentWrite on the cluster (or a broker of Kafka 2.8+)", Err: err}
	}
	return nil
}

// Watch turns the refusals that a consumer's polls report (a topic it may
// not read, a group it may not join) into an *Error once one lasts: a
// refusal seen again Grace or more after it was first seen. A refusal that
// clears (an ACL granted a moment after the consumer started) is
// forgotten once it has not been seen for two Graces.
type Watch struct {
	Group string
	Grace time.Duration

	first, last map[string]time.Time
}

// DefaultGrace is how long a refusal may last before a runner gives up.
const DefaultGrace = 5 * time.Second

// Check looks at f's errors at time now.
func (w *Watch) Check(f kgo.Fetches, now time.Time) error {
	if w.first == nil {
		w.first, w.last = map[string]time.Time{}, map[string]time.Time{}
	}
	var lasting error
	f.EachError(func(topic string, _ int32, err error) {
		var e *eoskit.AuthorizationError
		switch {
		case lasting != nil:
			return
		case errors.Is(err, kerr.GroupAuthorizationFailed):
			e = &eoskit.AuthorizationError{Permission: "Read on group " + w.Group, Err: err}
		case errors.Is(err, kerr.TopicAuthorizationFailed) && topic != "":
			e = &eoskit.AuthorizationError{Permission: "Read on topic " + topic, Err: err}
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			e = &eoskit.AuthorizationError{Permission: "Read on the topics it consumes", Err: err}
		default:
			return
		}
		k := e.Permission
		if last, ok := w.last[k]; !ok || now.Sub(last) > 2*w.Grace {
			w.first[k] = now
		}
		w.last[k] = now
		if now.Sub(w.first[k]) >= w.Grace {
			lasting = e
		}
	})
	return lasting
}
