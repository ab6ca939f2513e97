// Package eostest gives a test a real Apache Kafka broker and a real
// PostgreSQL, for the tests of an application built on eoskit (and for
// eoskit's own).
//
// # Where the services come from
//
// [Kafka] and [Postgres] look in this order:
//
//  1. The environment: KAFKA_BROKERS (host:port[,host:port]) and
//     DATABASE_URL (a postgres:// URL). A service started once for a whole
//     test run, by a script or by CI, is the fastest.
//  2. Docker, through testcontainers-go: a container started for this test
//     and terminated when it ends (tb.Cleanup). The images are the official
//     apache/kafka:4.4.0 and postgres:15, the releases eoskit's suite runs
//     on; EOSKIT_KAFKA_IMAGE and EOSKIT_POSTGRES_IMAGE name others. eoskit's
//     CI has no registry and runs images it builds itself
//     (scripts/images.sh) that keep the official images' environment
//     contracts: the official images themselves, and published ports, have
//     not run there. Only Docker not answering counts as "no service": a
//     container that Docker runs but that fails to come up fails the test.
//  3. Neither: the test is skipped, saying how to get the service, unless
//     EOS_REQUIRE_SERVICES=1, which turns the skip into a failure (set it
//     in CI, so that a suite can not pass by skipping).
//
// The variables are used as given: never point them at a cluster or a
// database holding data you care about.
//
// # Networks
//
// By default a container publishes its port on the Docker host, which is
// what Docker Desktop and a laptop's engine offer. With
// EOSKIT_DOCKER_NETWORK=host (or [WithHostNetwork]) it joins the host's
// network instead and listens on free 127.0.0.1 ports: no bridge, no port
// mapping, addresses that stay the same when a container restarts (on
// Linux: Docker Desktop's host network is its VM's). A cluster of several
// Kafka nodes ([WithNodes]) needs the host network.
//
// # Readiness
//
// A Kafka container counts as started once it logs "Kafka Server started"
// (testcontainers' wait strategy; the nodes of a cluster start together,
// since none gets there before a majority of controllers runs), and
// [RunKafka] returns once every node is a broker in Metadata and every
// replica is in sync. A PostgreSQL container is ready once it takes a
// connection.
//
// # Faults
//
// [RunKafka] returns a [KafkaContainer] whose nodes a test stops, kills and
// starts ([KafkaContainer.Stop], [KafkaContainer.Kill],
// [KafkaContainer.Start]) or replaces by a new container
// ([KafkaContainer.Replace]): each node keeps its data on a volume of its
// own, so a restarted or replaced node comes back with its log, as a
// broker restarted in production would. Apache Kafka 4.1 to 4.4 may drop
// transaction markers while a partition has no leader (KAFKA-20734), which
// a single broker's restart always causes: bounce a node of a three-node
// cluster (WithNodes(3): replication factor 3, min.insync.replicas 2), not
// a single broker, in a test of transactions.
//
// # Ryuk
//
// testcontainers-go normally starts its reaper, Ryuk, from an image pulled
// from Docker Hub, to remove containers a crashed test binary left, and
// fails every container when it can not. When its image is missing from
// the engine and a pull fails within 30 s, this package sets
// TESTCONTAINERS_RYUK_DISABLED=true for the process before testcontainers
// reads its configuration, and logs so (in the test's log under
// [StartKafka] and [StartPostgres]): its containers are terminated by
// tb.Cleanup (or by [KafkaContainer.Terminate]) in any case, but a test
// binary killed mid-run then leaves its containers behind. It looks only
// in the plain case (the variable empty, no ~/.testcontainers.properties,
// no TESTCONTAINERS_PROVIDER or TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX, an
// engine at DOCKER_HOST or the default socket), and only before anything
// in the process used testcontainers; otherwise set the variable yourself.
package eostest
