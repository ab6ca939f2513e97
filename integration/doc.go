// Package integration is the kit for integration tests of applications
// built on eoskit, against a real Apache Kafka and a real PostgreSQL: the
// services, names that tests sharing them never share, topics and
// databases of a test's own, waits with deadlines, node faults, a child
// process to crash, and the verifier. eoskit's own tests use it too.
//
//	func TestCopier(t *testing.T) {
//		k := integration.Kafka(t)               // KAFKA_BROKERS, else a container, else skip
//		in, out := k.NewTopic(3), k.NewTopic(3) // unique names, ready, deleted at the end
//		group := integration.UniqueName(t, "copier")
//		ids := k.Seed(in, 1000)                 // the copy workload's input
//		// ... run the copier under test on k.Brokers, from in to out, in group ...
//		k.WaitCaughtUp(group, in, time.Minute)  // its offsets reach the input's end
//		k.VerifyTopic(ids, out, time.Minute)    // no loss, duplicate, aborted read, reordering
//	}
//
// [Postgres] gives a test a database of its own in the same way.
// TestFeedTotalsAreExactAfterASIGKILL (feed_test.go) is a whole test of a
// program: an offsetstore feed killed with SIGKILL mid-run and started
// again, its totals exact.
//
// # Where the services come from
//
// [Kafka] (and [KafkaBrokers], the addresses alone) looks, in this order:
//
//  1. KAFKA_BROKERS (host:port[,host:port]): a broker started once for the
//     whole run, by a script or by CI. The fastest.
//  2. Docker, through testcontainers-go: a broker container started for
//     the test and terminated when it ends ([StartKafka]).
//  3. Neither: the test is skipped, saying how to get a broker.
//
// [Postgres] (and [PostgresServer], the server's URL alone) looks, in this
// order:
//
//  1. DATABASE_URL (a postgres:// URL of a role that may create
//     databases).
//  2. Docker: a PostgreSQL container started for the test and terminated
//     when it ends ([StartPostgres]).
//  3. An embedded PostgreSQL server of the test's own (PostgreSQL 17 from the
//     zonky binaries Maven Central serves, downloaded once into the user's
//     cache directory; as root, run as nobody), stopped and deleted when the
//     test ends: database tests run with no Docker (Linux only).
//  4. None: the test is skipped, saying how to get a server.
//
// A three-node cluster whose nodes a test stops ([StartCluster]) always
// runs in containers: a cluster named by KAFKA_BROKERS can not be bounced.
// With EOS_REQUIRE_SERVICES=1 a skip for a missing service is a failure:
// set it in CI, so that a suite can not pass by skipping. Only "no
// service" skips: a KAFKA_BROKERS that does not answer within 30 s skips
// like a missing one, but a container that Docker runs and that does not
// come up fails the test, as does a database that can not be created.
//
// The images are apache/kafka:4.4.0 and postgres:15, the releases eoskit's
// guarantees are proven on; EOSKIT_KAFKA_IMAGE and EOSKIT_POSTGRES_IMAGE
// name others that keep the official images' environment contracts
// (KAFKA_* and CLUSTER_ID; POSTGRES_* and PGPORT). eoskit's own CI has no
// registry and runs images it builds itself (scripts/images.sh).
//
// # What the kit guarantees
//
//   - Isolation on shared services: every name from [UniqueName] carries
//     the test's name and a random suffix; [KafkaCluster.NewTopic] creates
//     a topic under such a name, and [Postgres] a database of the test's
//     own. Tests may run in parallel (t.Parallel) without seeing each
//     other's data.
//   - Readiness: a topic from [KafkaCluster.NewTopic] or
//     [KafkaCluster.CreateTopic] is listed with a leader for each partition
//     by every broker before it is returned; [StartCluster], and each node
//     fault that brings a node back, return once every node is a broker
//     and every replica is in sync; a PostgreSQL container once it takes a
//     connection.
//   - Deadlines: every wait ends, at the latest at the timeout it is given
//     or at a bound it documents, with an error naming what it waited for
//     and what was missing ([KafkaCluster.WaitCaughtUp] names each
//     partition behind, by how much).
//   - Settled reads: [KafkaCluster.ReadAll], and the verifier on top of
//     it, read only once no transaction is open on the topic, so that a
//     commit whose markers are still being written is not taken for a
//     loss.
//   - Cleanup: topics, databases, containers, volumes, clients and child
//     processes are removed when the test ends (tb.Cleanup); a child
//     process is also killed if the test binary dies first (Linux's
//     parent-death signal).
//
// # What breaks it
//
//   - Pointing KAFKA_BROKERS or DATABASE_URL at a cluster or a server
//     holding data you care about: the kit creates and deletes topics and
//     databases there, and DATABASE_URL's role must be allowed to create
//     databases.
//   - Names not from [UniqueName] (a fixed group, a fixed transactional
//     id) on a shared broker: two tests, or two runs, meet.
//   - Bouncing the shared broker from a test (the broker of KAFKA_BROKERS
//     serves every test of the run): faults belong on a [StartCluster].
//   - Bouncing a single broker in a test of transactions: Apache Kafka 4.1
//     to 4.4 may drop transaction markers while a partition has no leader
//     (KAFKA-20734), which a single broker's restart always causes. Use
//     the three-node [Cluster] (replication factor 3, min.insync.replicas
//     2), whose restarts move leadership instead.
//   - Waiting for "caught up" on offsets nobody commits to Kafka: an
//     offsetstore.Runner keeps its offsets in PostgreSQL, and
//     [KafkaCluster.WaitCaughtUp] sees them only with
//     offsetstore.MirrorToKafka.
//   - Starting a child from a goroutine locked to its OS thread
//     (runtime.LockOSThread) that then ends: Linux sends the parent-death
//     signal when the thread that started the child exits.
//   - A test binary killed mid-run with Ryuk off (see below): its
//     containers stay behind, labelled [Label].
//
// # Faults
//
// [StartCluster] returns a [Cluster] whose Nodes a test stops
// ([KafkaContainer.Stop]: SIGTERM), kills ([KafkaContainer.Kill]:
// SIGKILL), pauses ([KafkaContainer.Pause]: frozen, as a long GC pause),
// starts again ([KafkaContainer.Start], [KafkaContainer.Unpause]) or
// replaces by a new container ([KafkaContainer.Replace]). Each node keeps
// its data on a volume of its own, so a restarted or replaced node comes
// back with its log, as a broker restarted in production would.
//
// A test crashes its own program with [StartChild]: the test binary runs
// again as a child process that runs a [ChildFunc] registered with
// [RunChild] in TestMain; [Child.Kill] sends it SIGKILL, [Child.Stop]
// SIGTERM.
//
// # The verifier
//
// Package verify holds the verifier that checks a run for lost,
// duplicated, aborted-but-visible and reordered records (and
// [verify.CheckTotals] for aggregates); programs import it without this
// kit and its testing and container dependencies. The kit reads a test's
// topics and tables and hands them to it: [KafkaCluster.VerifyTopic] and
// [KafkaCluster.VerifyInputs] for the copy workload that
// [KafkaCluster.Seed] and [KafkaCluster.SeedHostile] write, and
// [VerifyTotals] for totals kept in PostgreSQL.
//
// # Networks
//
// By default a container publishes its port on the Docker host, which is
// what Docker Desktop and a laptop's engine offer: on the loopback address
// the engine is reached by when it runs on this machine (no other host
// reaches a test's superuser database or broker), on every interface when
// the engine is remote (DOCKER_HOST=tcp://other-host:...), where it must
// be reached from here. The PostgreSQL container's password is random,
// made per container, and in its URL. With
// EOSKIT_DOCKER_NETWORK=host (or [WithHostNetwork]) it joins the host's
// network instead and listens on free 127.0.0.1 ports: no bridge, no port
// mapping, addresses that stay the same when a container restarts (on
// Linux: Docker Desktop's host network is its VM's). A cluster of several
// nodes ([StartCluster], [WithNodes]) needs the host network.
//
// # Ryuk
//
// testcontainers-go normally starts its reaper, Ryuk, from an image pulled
// from Docker Hub, to remove containers a crashed test binary left, and
// fails every container when it can not. When its image is missing from
// the engine and a pull fails within 30 s, this package sets
// TESTCONTAINERS_RYUK_DISABLED=true for the process before testcontainers
// reads its configuration, and logs so (in the test's log): its containers
// are terminated by tb.Cleanup (or by [KafkaContainer.Terminate]) in any
// case. It looks only in the plain case (the variable empty, no
// ~/.testcontainers.properties, no TESTCONTAINERS_PROVIDER or
// TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX, an engine at DOCKER_HOST or the
// default socket), and only before anything in the process used
// testcontainers; otherwise set the variable yourself.
package integration
