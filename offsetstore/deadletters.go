package offsetstore

import "github.com/eoskit/eoskit/internal/deadletter"

// DeadLetterTable is the table the [DeadLetter] policy parks records in,
// created by [Migrate] (and by dedup's, which parks in it too). A record
// is parked in the transaction that stores its offset, so it is parked
// once or not at all. Its columns:
//
//	id                          bigserial    the row's id
//	consumer_group              text         the group whose runner parked it
//	topic, partition, "offset"  text, integer, bigint
//	                                         where it was read (unique per group
//	                                         and topic_id)
//	key, value                  bytea        as they came
//	headers                     jsonb        [{"key": "...", "value": "<base64>"}], NULL for none
//	error                       text         why it failed (NUL and bytes that are
//	                                         not UTF-8 as U+FFFD)
//	created_at                  timestamptz  when it was parked
//	parked_by                   text         "offsetstore" or "dedup"; NULL: an earlier
//	                                         eoskit parked it (no headers, no claim kept)
//	claim_schema, claim_table,  text, text,  dedup only: the id its consumer claimed
//	claim_scope, claim_id       text, bytea  for it, which a replay releases
//	topic_id                    uuid         the topic's ID as its fetch named it
//	                                         (NULL: an earlier eoskit, or a broker
//	                                         before Kafka 3.1): a topic deleted and
//	                                         created again parks beside the old one
//
// `eoskit dead-letters list -database-url URL` lists them (never their
// values); `eoskit dead-letters replay` sends them back to their topics
// (or one it names) through the outbox, each exactly once: one database
// transaction writes a batch to the outbox and deletes its rows, so an
// exactly-once relay must run on that database (see package outbox). Consumers of the
// topic in other groups see a replayed record again (each carries an
// eoskit-replayed-from header): replay to a topic only this group reads
// when that matters.
const DeadLetterTable = deadletter.Table
