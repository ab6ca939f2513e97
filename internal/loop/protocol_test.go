package loop

import (
	"strings"
	"testing"
)

// The consumer protocol is allowed on Kafka 4.3 and later alone, with
// group.version finalized, on every broker, under a balancer franz-go
// takes for it; each refusal says why.
func TestConsumerProtocolRefusal(t *testing.T) {
	v43 := BrokerVersions{NodeID: 1, Heartbeat: 1, DescribeLogDirs: 5, GroupVersion: 1}
	v42 := BrokerVersions{NodeID: 2, Heartbeat: 1, DescribeLogDirs: 4, GroupVersion: 1}
	v39 := BrokerVersions{NodeID: 3, Heartbeat: 0, DescribeLogDirs: 4}
	noFeature := v43
	noFeature.GroupVersion = 0
	for _, tc := range []struct {
		name     string
		brokers  []BrokerVersions
		balancer string
		want     string // a part of the reason; "" allowed
	}{
		{"4.3+", []BrokerVersions{v43, {NodeID: 2, Heartbeat: 1, DescribeLogDirs: 5, GroupVersion: 1}}, "cooperative-sticky", ""},
		{"range", []BrokerVersions{v43}, "range", ""},
		{"sticky", []BrokerVersions{v43}, "sticky", ""},
		{"round-robin", []BrokerVersions{v43}, "roundrobin", "range or sticky"},
		{"4.2", []BrokerVersions{v42}, "cooperative-sticky", "older than Kafka 4.3"},
		{"rolling upgrade", []BrokerVersions{v43, v42}, "cooperative-sticky", "broker(s) 2 are older"},
		{"3.9", []BrokerVersions{v39}, "cooperative-sticky", "no ConsumerGroupHeartbeat v1"},
		{"feature off", []BrokerVersions{noFeature}, "cooperative-sticky", "group.version"},
		{"no answer", nil, "cooperative-sticky", "no broker"},
	} {
		got := ConsumerProtocolRefusal(tc.brokers, tc.balancer)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: refusal %q, want one naming %q", tc.name, got, tc.want)
		}
	}
}
