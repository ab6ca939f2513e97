package eoslab

import (
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// EmbeddedSessionTimeout is the group session timeout the lab uses on
// [EmbeddedCluster]: short, so that the zombie fault (a stall past it)
// costs seconds.
const EmbeddedSessionTimeout = 1500 * time.Millisecond

// EmbeddedCluster starts franz-go's in-process fake cluster (kfake) for a
// lab run with no services: a demo of what each pattern does, not a proof,
// since kfake is not Kafka. Its minimum session timeout is lowered from
// Kafka's 6 s default so that [EmbeddedSessionTimeout] is allowed. Close it
// when done.
func EmbeddedCluster() (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(500*time.Millisecond))
}
