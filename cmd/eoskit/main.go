// Command eoskit is the operator's tool for what eoskit's runners leave to
// an operator: hanging transactions (KIP-664), which a partition holds open
// while their coordinator has moved on (Apache Kafka 4.1 to 4.4 leave them
// behind when a partition is leaderless while markers are written,
// KAFKA-20734; see docs/KAFKA-20734.md), and dead letters, the records the
// DeadLetter policies parked; and an outbox relay's position after its
// database was restored from a backup.
//
//	go run ./cmd/eoskit txn find-hanging [-topic T]... [-min-age 16m]
//	go run ./cmd/eoskit txn describe -id TRANSACTIONAL_ID [-topic T]...
//	go run ./cmd/eoskit txn close -topic T -partition P -producer-id N [-outcome auto|commit|abort] [-dry-run] [-clients-speak-v2] [-min-age 16m]
//	go run ./cmd/eoskit dead-letters list   -database-url URL [-group G] [-topic T] [-id N]... [-limit 100]
//	go run ./cmd/eoskit dead-letters replay -database-url URL [-outbox NAME] [-group G] [-topic T] [-id N]... [-earlier] [-to-topic T]
//	go run ./cmd/eoskit dead-letters list|replay -outbox-dead-letters [-outbox NAME] [-id N]... [-limit 100] [-to-topic T]
//	go run ./cmd/eoskit dead-letters list   -dead-letter-topic T [-replay-group G] [-limit 100]
//	go run ./cmd/eoskit dead-letters replay -dead-letter-topic T [-replay-group G] [-to-topic T]
//	go run ./cmd/eoskit outbox resume-after -database-url URL -position-topic T -lsn LSN [-outbox NAME] [-slot S] [-transactional-id ID]
//
// # Hanging transactions
//
// find-hanging lists every hanging transaction in the given topics (default:
// every topic, __consumer_offsets included) with the evidence of how it
// ended. describe shows one transactional id as its coordinator sees it, and
// every partition that holds a transaction of its producer open. Both only
// read: DescribeProducers needs Read on the topics, ListTransactions and
// DescribeTransactions Describe on the transactional ids. A topic the
// principal may not see is left out of "every topic": find-hanging says
// how many partitions it looked at.
//
// close writes the marker that closes one hanging transaction in one
// partition (WriteTxnMarkers, as kafka-transactions.sh abort does, which
// needs ClusterAction). The marker must carry the outcome the transaction's
// other records already have: aborting an offset commit whose outputs are
// visible duplicates them, committing one whose outputs were aborted loses
// them. The coordinator's state tells that outcome only for a client that
// speaks transaction protocol v2 (an epoch per transaction); a cluster that
// offers v2 still serves v1 to older clients, so the tool reads it only
// under -clients-speak-v2, which the operator vouches for. close refuses an
// unknown outcome unless -outcome names it, and an -outcome that
// contradicts a known one. -dry-run shows the marker and writes nothing.
//
// # Dead letters
//
// With -database-url (default $DATABASE_URL), the PostgreSQL table that
// offsetstore and dedup park records in (offsetstore.DeadLetterTable);
// with -dead-letter-topic, a Kafka topic that eos's DeadLetter policy or an
// outbox relay's DeadLetter option writes to. list prints what is parked,
// oldest first: where each record was read (or, from an outbox, the topic
// it was meant for), why it failed and the sizes of its key and value,
// never the data. For the table, -group and -topic (the topic it was read
// from) and -id (row ids, repeatable) narrow both commands.
//
// replay sends parked records back to the topic they were read from (or
// meant for), or to -to-topic, with their key, value and headers and an
// eoskit-replayed-from header:
//
//   - from the table, through the database's outbox (package outbox;
//     -outbox names one, as outbox.Name does): one database transaction
//     writes a batch of records to the outbox, releases the ids dedup
//     claimed for them and deletes their rows, so that with an
//     exactly-once relay a record is published once, or stays parked,
//     whatever crashes. It takes the rows there are when it starts (a
//     record that fails again is parked anew, for a later replay), and
//     refuses rows an earlier eoskit parked unless -earlier: they kept no
//     headers, and dedup's claim of one is unknown, so that its replay
//     would be skipped as a copy. A relay must run on that database to
//     publish them (replay warns when none reads the outbox's slot).
//
//   - from a topic, as an eos processor in a group of its own,
//     -replay-group (default eoskit-replay-TOPIC; one with live members,
//     an application's, is refused), with transactional id
//     REPLAY-GROUP-replay: the copies and the group's offsets commit in
//     one transaction, so a record is replayed once however often replay
//     runs, and a second run replays only what was parked since. It stops
//     once it has copied at least what the topic held when it started. A
//     record the outbox kept no value of (too large for Kafka) is passed
//     by with a warning: its row in the outbox's dead-letter table is
//     moved back with -outbox-dead-letters (below). It needs Read on the
//     topic and the group, Write on the target topics and on the
//     transactional id.
//
//   - from an outbox's own dead-letter table (-outbox-dead-letters, of
//     -outbox NAME or the default outbox), where its relay keeps every
//     record it dead-lettered whole: list shows them; replay moves them
//     back into that outbox, each written again and its row deleted in one
//     database transaction, so that the relay publishes it once. It needs
//     the service's own database role.
//
// Records replayed to the topic they came from are seen again by every
// group reading that topic, not only the one that parked them; replay to a
// topic that only that group reads when that matters.
//
// # A restored outbox database
//
// A relay whose database was restored to before what it last published
// stops with outbox.ErrRewound, naming the transaction Kafka's position
// ends with and what the restored log holds there. outbox resume-after
// is the operator's decision (outbox.Relay.ResumeAfter): -lsn is where the
// restored server's log ends (a point-in-time recovery's target LSN; for a
// backup or snapshot, its last checkpoint: pg_controldata's "Latest
// checkpoint location", or SELECT checkpoint_lsn FROM
// pg_control_checkpoint() before the server takes new writes; a point
// before the true end publishes again what lies between, never loses).
// It commits that position, under the relay's transactional id (which
// fences a relay of the slot still running): the relay's next run
// publishes every transaction that ends past it. It needs Write on the
// position topic and on the transactional id, and the relay's own
// database role (REPLICATION, to identify the server; the outbox's token
// table).
//
// Common flags: -brokers (default $KAFKA_BROKERS, else 127.0.0.1:9092),
// -timeout (default 1m), -json; on a cluster that authenticates,
// -sasl-mechanism (scram-sha-256, scram-sha-512, or plain, the last over
// TLS only) and -sasl-user, with the password in $EOSKIT_SASL_PASSWORD
// (never on the command line, where other users of the machine can read
// it), or -sasl-mechanism oauthbearer (over TLS only) with
// -sasl-token-file, a file holding the token, read at each
// authentication; -tls (the system's CAs), -tls-ca FILE (those CAs
// alone), -tls-cert and -tls-key (mutual TLS). Or, as Kafka's tools take
// them, -command-config FILE: a client properties file
// (bootstrap.servers, security.protocol, sasl.mechanism, sasl.jaas.config
// or sasl.username and sasl.password, sasl.oauthbearer.token.endpoint.url
// as a file: URL and the JAAS extension_ options, ssl.truststore.location
// or ssl.ca.location in PEM, ssl.keystore.location in PEM or
// ssl.certificate.location and ssl.key.location); a flag given
// wins over the file. The host name is always checked. Exit status: 0
// done (find-hanging: none found), 1 error or refusal, 2 usage (connection
// settings missing, or given that the command cannot honour, included),
// 3 find-hanging found some.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  eoskit txn find-hanging [-topic T]... [-min-age 16m]
  eoskit txn describe -id TRANSACTIONAL_ID [-topic T]...
  eoskit txn close -topic T -partition P -producer-id N [-outcome auto|commit|abort] [-dry-run] [-clients-speak-v2] [-min-age 16m]
  eoskit dead-letters list   -database-url URL [-group G] [-topic T] [-id N]... [-limit 100]
  eoskit dead-letters replay -database-url URL [-outbox NAME] [-group G] [-topic T] [-id N]... [-earlier] [-to-topic T]
  eoskit dead-letters list|replay -outbox-dead-letters [-outbox NAME] [-id N]... [-limit 100] [-to-topic T]
  eoskit dead-letters list   -dead-letter-topic T [-replay-group G] [-limit 100]
  eoskit dead-letters replay -dead-letter-topic T [-replay-group G] [-to-topic T]
  eoskit outbox resume-after -database-url URL -position-topic T -lsn LSN [-outbox NAME] [-slot S] [-transactional-id ID]
common flags: -brokers host:port[,...] (default $KAFKA_BROKERS) -timeout 1m -json
  -sasl-mechanism scram-sha-256|scram-sha-512|plain -sasl-user U (password in $EOSKIT_SASL_PASSWORD)
  -sasl-mechanism oauthbearer -sasl-token-file FILE
  -tls -tls-ca FILE -tls-cert FILE -tls-key FILE, or -command-config FILE (Kafka client properties)
`

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitFound = 3
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "txn":
			return runTxn(ctx, args[1:], stdout, stderr)
		case "dead-letters":
			return runDeadLetters(ctx, args[1:], stdout, stderr)
		case "outbox":
			return runOutbox(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprint(stderr, usage)
	return exitUsage
}

// topicList is a repeatable -topic flag.
type topicList []string

func (l *topicList) String() string     { return strings.Join(*l, ",") }
func (l *topicList) Set(v string) error { *l = append(*l, v); return nil }

// idList is a repeatable -id flag.
type idList []int64

func (l *idList) String() string { return fmt.Sprint(*l) }
func (l *idList) Set(v string) error {
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id <= 0 {
		return errors.New("want a row id (a positive number)")
	}
	*l = append(*l, id)
	return nil
}
