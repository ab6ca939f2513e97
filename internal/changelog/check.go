package changelog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/topiccheck"
	"github.com/eoskit/eoskit/topics"
)

// DefaultMaxMessageBytes is Kafka's default message.max.bytes (and so a
// topic's max.message.bytes when it sets none): the record limit [Check]
// assumes when it may not read the changelog's configs.
const DefaultMaxMessageBytes = 1048588

// Shape is what [Check] found of a changelog topic.
type Shape struct {
	Partitions int32
	// ConfigsRead is false when the principal may not describe the
	// topic's configs (and the check was not required): CleanupPolicy is
	// then "" and MaxMessageBytes DefaultMaxMessageBytes, unverified.
	ConfigsRead     bool
	CleanupPolicy   string
	MaxMessageBytes int
	// RetentionMs is the topic's retention.ms (-1: none; 0 when the
	// configs were not read).
	RetentionMs int64
	// Created is true when Check created the topic.
	Created bool
}

// CheckOptions tune [Check].
type CheckOptions struct {
	// Create creates the changelog when it is missing: compacted, with
	// the input's partition count and the broker's default replication
	// factor. It needs Create on the topic, which an application's
	// account seldom has: off by default, a missing changelog is a
	// *eoskit.ConfigError.
	Create bool
	// RequireConfigs makes a refused DescribeConfigs on the changelog an
	// *eoskit.AuthorizationError. Off by default: an application's
	// account has Read and Write on its topics, which do not include
	// DescribeConfigs, and eoskit never needs more than that unless asked
	// to; Check then logs once at Warn that it could not verify the
	// cleanup policy, and assumes Kafka's default record limit.
	RequireConfigs bool
	// Logger gets that warning (default slog.Default()).
	Logger *slog.Logger
}

// cleanupRefusal says why a key-value changelog may not have the cleanup
// policy policy, or "" when it may: compact alone. Without compact, or
// with delete beside it, Kafka deletes segments older than retention.ms
// (7 days by default), so a key not written for that long is gone: a
// restore misses it (a count restarts at 0) and a pebble checkpoint
// behind the new log start is wiped. Kafka Streams makes key-value
// changelogs compact alone (compact,delete is for windowed stores).
func cleanupRefusal(policy string) string {
	ps := policies(policy)
	switch {
	case !slices.Contains(ps, "compact"):
		return "a changelog must be compacted (cleanup.policy=compact), or it loses keys to retention"
	case slices.Contains(ps, "delete"):
		return "a key-value changelog must be compacted alone (cleanup.policy=compact): with delete, a key not written within retention.ms is deleted from the changelog and a restore misses it"
	}
	return ""
}

// Check refuses a changelog topic that cannot hold the state of an input
// of partitions partitions with a *eoskit.ConfigError naming it: missing
// (unless o.Create), another partition count (changelog partition n holds
// input partition n's state), or a cleanup.policy other than compact
// alone (the changelog would lose keys to retention, and a restore would
// silently miss them); and with an *eoskit.AuthorizationError one the principal
// may not Read (the restore) or Write (each transaction), as the broker's
// list of the topic's authorized operations says, so that an empty
// changelog does not hide a missing ACL until the first restore with
// state. It reaches the cluster through a client of its own built from
// conn, and needs Describe on the topic, DescribeConfigs to verify its
// configs (see [CheckOptions.RequireConfigs]) and Create to create it. A
// missing topic is reported once it has stayed missing for
// topiccheck.MissingFor (5 s).
func Check(ctx context.Context, conn []kgo.Opt, topic string, partitions int32, o CheckOptions) (Shape, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	var sh Shape
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return sh, fmt.Errorf("changelog: new client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if o.Create {
		// Creates it if missing, at once; one that exists is checked
		// below (a conflicting shape is refused there, by name).
		created, err := topics.Ensure(ctx, adm, topics.Spec{Name: topic, Partitions: partitions,
			Configs: map[string]string{"cleanup.policy": "compact"}})
		if err != nil && !errors.Is(err, topics.ErrConflict) {
			return sh, fmt.Errorf("changelog: create %q: %w", topic, err)
		}
		sh.Created = len(created) > 0
	} else {
		missing, err := topiccheck.Missing(ctx, conn, topic)
		if err != nil {
			return sh, fmt.Errorf("changelog: %w", err)
		}
		if missing >= 0 {
			return sh, refuse(topic, fmt.Sprintf("topic %q does not exist: create it with %d partitions and cleanup.policy=compact, or pass eos.CreateChangelog()", topic, partitions))
		}
	}
	tds, err := topiccheck.Describe(ctx, conn, topic)
	if err != nil {
		return sh, fmt.Errorf("changelog: %w", err)
	}
	if td := tds[topic]; td.Err != nil {
		return sh, fmt.Errorf("changelog: look up %q: %w", topic, td.Err)
	}
	sh.Partitions = int32(len(tds[topic].Partitions))
	if sh.Partitions != partitions {
		return sh, refuse(topic, fmt.Sprintf("topic %q has %d partitions, the input %d: changelog partition n holds the state of input partition n, so the counts must be equal (never add partitions to either)", topic, sh.Partitions, partitions))
	}
	if err := mayReadAndWrite(ctx, adm, topic); err != nil {
		return sh, err
	}
	if err := readConfigs(ctx, adm, topic, &sh); err != nil {
		if !authz.Refused(err) {
			return sh, fmt.Errorf("changelog: describe the configs of %q: %w", topic, err)
		}
		if o.RequireConfigs {
			return sh, &eoskit.AuthorizationError{Permission: "DescribeConfigs on topic " + topic, Err: err}
		}
		o.Logger.Warn("changelog: may not describe the changelog's configs: its cleanup policy is not verified (it must be compact alone) and Kafka's default record limit is assumed; grant DescribeConfigs on the topic to verify them",
			"topic", topic, "assumed_max_message_bytes", DefaultMaxMessageBytes)
		sh.MaxMessageBytes = DefaultMaxMessageBytes
		return sh, nil
	}
	if reason := cleanupRefusal(sh.CleanupPolicy); reason != "" {
		return sh, refuse(topic, fmt.Sprintf("topic %q has cleanup.policy=%s: %s", topic, sh.CleanupPolicy, reason))
	}
	return sh, nil
}

// mayReadAndWrite refuses a topic the principal may not Read or Write,
// from the operations the broker lists as authorized on it (Metadata v8+;
// a broker that lists none is not second-guessed). A refusal must last
// authz.DefaultGrace: an ACL reaches each broker through its metadata
// log, and one granted just before the start may not have reached the
// broker asked.
func mayReadAndWrite(ctx context.Context, adm *kadm.Client, topic string) error {
	var refused error
	for deadline := time.Now().Add(authz.DefaultGrace); ; {
		md, err := adm.Metadata(kadm.WithAuthorizedOps(ctx), topic)
		if err != nil {
			return fmt.Errorf("changelog: look up the operations allowed on %q: %w", topic, err)
		}
		if refused = missingOp(md.Topics[topic].AuthorizedOperations, topic); refused == nil || time.Now().After(deadline) {
			return refused
		}
		select {
		case <-ctx.Done():
			return refused
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// missingOp names Read or Write if ops (a topic's authorized operations,
// none when the broker lists none) lacks it.
func missingOp(ops []kadm.ACLOperation, topic string) error {
	if len(ops) == 0 {
		return nil
	}
	for _, need := range []struct {
		op   kadm.ACLOperation
		name string
	}{{kadm.OpRead, "Read"}, {kadm.OpWrite, "Write"}} {
		if !slices.Contains(ops, need.op) {
			return &eoskit.AuthorizationError{Permission: need.name + " on topic " + topic, Err: kerr.TopicAuthorizationFailed}
		}
	}
	return nil
}

// RecordLimit returns topic's max.message.bytes, the largest record it
// takes (a topic other than the changelog that a transaction writes the
// same records to: a processor's updates topic). It reaches the cluster
// through a client of its own built from conn, and needs DescribeConfigs
// on the topic: a refusal is returned as the broker's error (see
// authz.Refused), for the caller to assume DefaultMaxMessageBytes or to
// refuse to run.
func RecordLimit(ctx context.Context, conn []kgo.Opt, topic string) (int, error) {
	sh, err := Configs(ctx, conn, topic)
	return sh.MaxMessageBytes, err
}

// Configs reads topic's configs into a Shape (its partitions left 0): an
// error for a principal that may not describe them (see authz.Refused).
func Configs(ctx context.Context, conn []kgo.Opt, topic string) (Shape, error) {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return Shape{}, fmt.Errorf("changelog: new client: %w", err)
	}
	defer cl.Close()
	var sh Shape
	err = readConfigs(ctx, kadm.NewClient(cl), topic, &sh)
	return sh, err
}

func refuse(topic, reason string) error {
	return &eoskit.ConfigError{Package: "state", Setting: "changelog " + topic, Reason: reason}
}

// readConfigs reads topic's cleanup.policy and max.message.bytes into sh.
func readConfigs(ctx context.Context, adm *kadm.Client, topic string, sh *Shape) error {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	rc, rerr := rcs.On(topic, nil)
	switch {
	case rerr == nil && rc.Err != nil:
		return rc.Err
	case rerr != nil && err != nil:
		if ae, ok := errors.AsType[*kadm.AuthError](err); ok {
			return ae.Err
		}
		return err
	case rerr != nil:
		return rerr
	}
	sh.ConfigsRead = true
	sh.MaxMessageBytes = DefaultMaxMessageBytes
	for _, c := range rc.Configs {
		if c.Value == nil {
			continue
		}
		switch c.Key {
		case "cleanup.policy":
			sh.CleanupPolicy = *c.Value
		case "max.message.bytes":
			if n, err := strconv.Atoi(*c.Value); err == nil {
				sh.MaxMessageBytes = n
			}
		case "retention.ms":
			if n, err := strconv.ParseInt(*c.Value, 10, 64); err == nil {
				sh.RetentionMs = n
			}
		}
	}
	return nil
}

func policies(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}
