package offsetstore_test

import (
	"testing"
	"time"

	"github.com/eoskit/eoskit/offsetstore"
)

// MirrorToKafka copies the stored offsets to the group on every
// assignment too, not only each batch's after its commit: a copy lost to a
// crash between the database commit and the mirror (here: a first run
// without the mirror, which leaves the same state) is made good when the
// partitions are next assigned, with no further input, and the group is
// caught up in Kafka. Before, only batches committed in the same session
// were copied: an idle partition stayed behind in Kafka for good
// (issue 47 item 2, failing on a0c3743).
func TestMirrorToKafkaCopiesTheStoredOffsetsOnAssignment(t *testing.T) {
	t.Parallel()
	const n = 600
	b := newBed(t, 3, n)
	first := b.start(t, load(nil))
	waitFor(t, time.Minute, "every row", func() bool { return b.rows(t) >= n })
	first.stop(t)
	mirrored := b.start(t, load(nil), offsetstore.MirrorToKafka())
	b.k.WaitCaughtUp(b.group, b.topic, 30*time.Second)
	mirrored.stop(t)
	if rows := b.rows(t); rows != n {
		t.Fatalf("%d rows, want %d: the mirror must not apply anything again", rows, n)
	}
}
