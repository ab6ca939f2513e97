package loop

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/eoskit/eoskit"
)

// Kafka's consumer group protocol (KIP-848, group.protocol=consumer):
// what a runner's ConsumerProtocol option adds to its client, and the
// check that the cluster serves it well.

// ConsumerProtocolOpts are the franz-go options that join a group with the
// consumer protocol: franz-go's kgo.ServerSideBalancer. franz-go uses it
// only with a range or sticky balancer first (cooperative-sticky, its
// default, is sticky), and otherwise, or on a broker without it, falls back
// to the classic protocol without a word: CheckConsumerProtocol refuses
// both.
func ConsumerProtocolOpts() []kgo.Opt { return []kgo.Opt{kgo.ServerSideBalancer()} }

// BrokerVersions is what CheckConsumerProtocol reads of one broker's
// ApiVersions answer.
type BrokerVersions struct {
	NodeID int32
	// Heartbeat is the newest ConsumerGroupHeartbeat (key 68) version it
	// serves (-1: none); DescribeLogDirs is DescribeLogDirs' (key 35).
	Heartbeat, DescribeLogDirs int16
	// GroupVersion is the cluster's finalized group.version as the broker
	// reports it (0: none).
	GroupVersion int16
}

// ConsumerProtocolRefusal decides whether the brokers serve the consumer
// protocol well, and says why not ("" when they do), with the balancer
// the client would use first (its protocol name):
//   - every broker serves ConsumerGroupHeartbeat v1 (Kafka 4.0; v0 was 3.7's
//     early access, which franz-go does not speak);
//   - the cluster finalized group.version 1 or later (the protocol's
//     feature flag);
//   - every broker is Kafka 4.3 or later, where KIP-1251 stops an offset
//     commit racing a heartbeat's epoch bump (before, such a commit fails
//     with STALE_MEMBER_EPOCH, and a transaction's aborts whenever the group
//     changes). KIP-1251 bumped no request's version: 4.3 shows as
//     DescribeLogDirs v5, which 4.3 introduced (as franz-go's kversion
//     tables record);
//   - the balancer is range or sticky (cooperative-sticky included).
//
// A cluster in a rolling upgrade fails until every broker runs 4.3.
func ConsumerProtocolRefusal(brokers []BrokerVersions, balancer string) string {
	if !slices.Contains([]string{"range", "sticky", "cooperative-sticky"}, balancer) {
		return fmt.Sprintf("franz-go joins with the consumer protocol only under its own range or sticky balancer, and the client's first is %q: it would join with the classic protocol", balancer)
	}
	if len(brokers) == 0 {
		return "no broker answered ApiVersions"
	}
	var old, noHeartbeat []string
	groupVersion := int16(-1)
	for _, b := range brokers {
		if b.Heartbeat < 1 {
			noHeartbeat = append(noHeartbeat, fmt.Sprint(b.NodeID))
		}
		if b.DescribeLogDirs < 5 {
			old = append(old, fmt.Sprint(b.NodeID))
		}
		groupVersion = max(groupVersion, b.GroupVersion)
	}
	switch {
	case len(noHeartbeat) > 0:
		return fmt.Sprintf("broker(s) %s serve no ConsumerGroupHeartbeat v1 (Kafka 4.0 or later does)", strings.Join(noHeartbeat, ", "))
	case groupVersion < 1:
		return "the cluster has not finalized group.version 1 (kafka-features.sh upgrade --feature group.version=1)"
	case len(old) > 0:
		return fmt.Sprintf("broker(s) %s are older than Kafka 4.3 (they serve DescribeLogDirs below v5), where an offset commit can race a heartbeat and fail (KIP-1251); use the classic protocol there", strings.Join(old, ", "))
	}
	return ""
}

// CheckConsumerProtocol asks every broker of cl's cluster for its API
// versions and returns ConsumerProtocolRefusal's reason, or "" when the
// cluster serves the consumer protocol well; an error when the brokers
// could not be asked.
func CheckConsumerProtocol(ctx context.Context, cl *kgo.Client) (string, error) {
	// franz-go looks at the first balancer's type, not its name: one of
	// another type is named by its type here.
	var balancer string
	if bs, ok := cl.OptValue(kgo.Balancers).([]kgo.GroupBalancer); ok && len(bs) > 0 {
		balancer = fmt.Sprintf("%T", bs[0])
		for _, own := range []kgo.GroupBalancer{kgo.RangeBalancer(), kgo.StickyBalancer(), kgo.CooperativeStickyBalancer()} {
			if reflect.TypeOf(bs[0]) == reflect.TypeOf(own) {
				balancer = bs[0].ProtocolName()
			}
		}
	}
	// A cap the client's options put on ConsumerGroupHeartbeat (below
	// v1) makes franz-go join with the classic protocol too.
	capped := int16(-1)
	if vs, ok := cl.OptValue(kgo.MaxVersions).(*kversion.Versions); ok && vs != nil {
		if v, ok := vs.LookupMaxKeyVersion(kmsg.ConsumerGroupHeartbeat.Int16()); ok {
			capped = v
		} else {
			capped = -2 // the key is left out: not sent at all
		}
	}
	answered, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		return "", fmt.Errorf("read the brokers' API versions: %w", err)
	}
	var brokers []BrokerVersions
	for _, v := range answered.Sorted() {
		if v.Err != nil {
			return "", fmt.Errorf("read broker %d's API versions: %w", v.NodeID, v.Err)
		}
		b := BrokerVersions{NodeID: v.NodeID, Heartbeat: -1, DescribeLogDirs: -1}
		if m, ok := v.KeyMaxVersion(kmsg.ConsumerGroupHeartbeat.Int16()); ok {
			b.Heartbeat = m
			if capped != -1 {
				b.Heartbeat = min(m, capped)
			}
		}
		if m, ok := v.KeyMaxVersion(kmsg.DescribeLogDirs.Int16()); ok {
			b.DescribeLogDirs = m
		}
		if raw := v.Raw(); raw != nil {
			for _, f := range raw.FinalizedFeatures {
				if f.Name == "group.version" {
					b.GroupVersion = f.MaxVersionLevel
				}
			}
		}
		brokers = append(brokers, b)
	}
	return ConsumerProtocolRefusal(brokers, balancer), nil
}

// ConsumerProtocolCheckTimeout bounds how long a runner's Run waits, at its
// start, for the brokers to answer CheckConsumerProtocol.
const ConsumerProtocolCheckTimeout = 30 * time.Second

// consumerProtocolRefused asks, through cl, whether the cluster serves
// the consumer protocol well: a *eoskit.ConfigError of pkg naming
// ConsumerProtocol when it would not, nil when it does or ctx ended.
// Brokers that cannot be asked (each try bounded by
// ConsumerProtocolCheckTimeout) are asked again, with a Warn line on
// logger, until ctx ends: only a refusal ends Run.
func consumerProtocolRefused(ctx context.Context, pkg string, cl *kgo.Client, logger *slog.Logger) error {
	for attempt := 1; ; attempt++ {
		askCtx, cancel := context.WithTimeout(ctx, ConsumerProtocolCheckTimeout)
		refusal, err := CheckConsumerProtocol(askCtx, cl)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil // Run's end: it returns as it does
		case err == nil && refusal != "":
			return &eoskit.ConfigError{Package: pkg, Setting: "ConsumerProtocol", Reason: refusal}
		case err == nil:
			return nil
		}
		logger.Warn(pkg+": checking that the cluster serves the consumer group protocol failed; asking again", "err", err, "attempt", attempt)
		if !PauseBeforeRetry(ctx, attempt) {
			return nil
		}
	}
}
