// Package testbed is what eoskit's own tests use beyond the public kit,
// package integration: services and probes that rest on eoskit's source
// tree (its scripts, Java, Maven) or on Kafka's internals, which a user's
// tests should not rely on.
//
//   - Private brokers and clusters started with scripts/kafka.sh and
//     scripts/kafka-cluster.sh ([StartLocalBroker], [StartLocalCluster],
//     and with SASL and ACLs [StartLocalBrokerWithACLs],
//     [StartLocalClusterWithACLs], [NewUser]), whose nodes a test kills,
//     pauses (SIGSTOP) and restarts, and a private PostgreSQL
//     ([StartPrivatePostgres]) it restarts under a running service.
//   - TCP proxies in front of a private cluster's nodes ([LocalCluster.Proxied])
//     that cut and heal the network between clients and one node.
//   - Broker states built with raw requests: a transaction left open over
//     an offset commit, a hanging transaction (the KAFKA-20734 aftermath),
//     the transactions still open on a topic ([LeaveOpenTransactionWithOffsets],
//     [LeaveHangingTransaction], [OpenTransactions], [RequireUnstable]),
//     the cluster's transaction.version, and names whose Java hash is
//     negative ([UniqueNegativeHashName]).
//   - The outbox tests' hostile writer ([OutboxLoad]), and whether a
//     group's rebalance has ended in its coordinator's view ([GroupSettled]).
//
// Like the kit, everything here skips a test when its service can not be
// had, and fails it instead with EOS_REQUIRE_SERVICES=1; a private service
// runs only when the shared ones are configured (KAFKA_BROKERS or
// DATABASE_URL set, or services required), since it takes seconds to a
// minute to start. Everything a test starts is stopped and its data
// deleted when the test ends, or, if the test binary dies first, by the
// scripts' watchdog (EOSKIT_OWNER_PID).
package testbed
