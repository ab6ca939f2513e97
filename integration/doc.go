// Package integration is eoskit's harness for tests against a real Apache
// Kafka broker and a real PostgreSQL. The verifier that checks a run for
// lost, duplicated, aborted-but-visible and reordered records is package
// verify, which programs import without this harness (and its testing and
// container dependencies); the helpers here (VerifyTopic, VerifyInputs)
// read a test's topics and hand them to it.
//
// # Where the services come from
//
// [Kafka] and [Postgres] look for their service in this order:
//
//  1. The environment: KAFKA_BROKERS (host:port[,host:port]) and DATABASE_URL
//     (a postgres:// URL of a role allowed to create databases). `make test`
//     starts both with the scripts under scripts/ and sets them.
//  2. Docker, through the public package eostest (testcontainers-go): a
//     container started for the test and terminated when it ends; its
//     image is the official one (apache/kafka:4.4.0, postgres:15) unless
//     EOSKIT_KAFKA_IMAGE / EOSKIT_POSTGRES_IMAGE name another. `make test`
//     runs a containers suite this way (scripts/containers.sh) on images
//     it builds itself (scripts/images.sh).
//  3. Neither: the test is skipped with a message saying how to get the
//     service, unless EOS_REQUIRE_SERVICES=1, which turns the skip into a
//     failure (`make test` sets it, so CI can not pass by skipping).
//
// # Isolation
//
// Tests share one broker and one PostgreSQL server. [KafkaCluster.NewTopic]
// creates a topic with a unique name and [Postgres] a fresh database that is
// dropped when the test ends, so tests can run in parallel without seeing
// each other's data.
//
// # Fault control
//
// A test that bounces brokers starts a cluster of its own: [StartLocalBroker]
// and [StartLocalCluster] from the scripts, or [StartContainerCluster], three
// nodes in containers that a test stops and starts while their state stays
// on their volumes.
package integration
