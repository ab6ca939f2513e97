package authz

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

func refusal(topic string, err error) kgo.Fetches {
	return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: []kgo.FetchPartition{{Partition: -1, Err: err}}}}}}
}

// A refusal ends the run only once it lasts: seen again Grace after it was
// first seen. One that clears (an ACL granted just after the start) is
// forgotten, and a later refusal starts its own grace. Other errors never
// count. The error names the permission and matches the broker's refusal.
func TestWatchGivesUpOnlyOnALastingRefusal(t *testing.T) {
	w := &Watch{Group: "billing", Grace: 5 * time.Second}
	t0 := time.Now()
	group := refusal("", &kgo.ErrGroupSession{Err: kerr.GroupAuthorizationFailed})
	if err := w.Check(group, t0); err != nil {
		t.Fatalf("a first refusal ended the run: %v", err)
	}
	if err := w.Check(refusal("orders", kerr.NotLeaderForPartition), t0.Add(time.Minute)); err != nil {
		t.Fatalf("a retriable error ended the run: %v", err)
	}
	if err := w.Check(group, t0.Add(4*time.Second)); err != nil {
		t.Fatalf("a refusal within its grace ended the run: %v", err)
	}
	err := w.Check(group, t0.Add(5*time.Second))
	var e *eoskit.AuthorizationError
	if !errors.As(err, &e) || e.Permission != "Read on group billing" || !errors.Is(err, kerr.GroupAuthorizationFailed) || !strings.Contains(err.Error(), "Read on group billing") {
		t.Fatalf("a lasting refusal gave %v; want an *eoskit.AuthorizationError naming Read on group billing", err)
	}

	topic := refusal("orders", kerr.TopicAuthorizationFailed)
	if err := w.Check(topic, t0); err != nil {
		t.Fatal(err)
	}
	// Not seen for more than two graces: cleared, so this is a new one.
	if err := w.Check(topic, t0.Add(11*time.Second)); err != nil {
		t.Fatalf("a refusal that had cleared ended the run at once: %v", err)
	}
	if err := w.Check(topic, t0.Add(16*time.Second)); err == nil || !strings.Contains(err.Error(), "Read on topic orders") {
		t.Fatalf("got %v; want the refusal to read orders", err)
	}
}

func TestWriteNamesWhatARefusedWriteNeeds(t *testing.T) {
	for err, want := range map[error]string{
		kerr.TopicAuthorizationFailed:           "Write on topic out",
		kerr.TransactionalIDAuthorizationFailed: "Write on transactional id app-0",
		kerr.GroupAuthorizationFailed:           "Read on group g",
	} {
		if got := Write("out", "app-0", "g", err); got == nil || !strings.Contains(got.Error(), want) || !errors.Is(got, err) {
			t.Errorf("Write(%v) = %v; want it to name %s", err, got, want)
		}
	}
	if got := Write("out", "app-0", "g", kerr.MessageTooLarge); got != nil {
		t.Errorf("Write(MessageTooLarge) = %v; want nil", got)
	}
}
