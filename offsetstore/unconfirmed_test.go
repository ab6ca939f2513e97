package offsetstore_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// A batch whose COMMIT the database carried out but never answered: the
// runner cannot know it committed, and retries it. The retry must find the
// batch committed, from the database's own record of the transaction, and
// go on: every record applied once, and no commit counted as refused
// (StaleRejected) nor logged as a zombie's. Before, the retry found the
// offsets rows moved (by its own commit), counted a stale owner and
// rewound as a zombie (issue 43 item 16, failing on 411f3b1).
func TestAnUnconfirmedCommitIsNotTakenForAZombie(t *testing.T) {
	t.Parallel()
	const n = 2000
	b := newBed(t, 2, n)
	cutter := &contract.CommitCutter{CommitsBefore: 3}
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = cutter.Dial
	// Plaintext, for the cutter to read the COMMIT.
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	b.runnerPoolWith(t, cfg)
	run := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(100))
	waitFor(t, time.Minute, "every record applied", func() bool { return b.rows(t) >= n })
	run.stop(t)
	if !cutter.Cut() {
		t.Fatal("no COMMIT was cut: the fault never struck")
	}
	t.Logf("verifier: %v", b.verify(t))
	if s := run.r.Stats(); s.StaleRejected != 0 {
		t.Fatalf("a commit whose answer was lost was counted as refused to a stale owner %d times: %+v", s.StaleRejected, s)
	}
}
