# eoskit's commands. `make test` is the one CI runs (through .ci/run).
SHELL := bash

.PHONY: test containers images bench demo chaos soak compat repro-kafka-20734 services services-stop clean-services

# Starts Kafka and PostgreSQL (or reuses running ones), runs gofmt, go vet and
# every test with -race against them, and stops what it started.
test:
	@scripts/test.sh

# Runs the containers suite of make test: Kafka and PostgreSQL in Docker
# through testcontainers-go (package integration), on images built here
# with no registry; and beside it eos.Processor through three broker
# containers stopped, started and replaced mid-run, which make test leaves
# out (make chaos runs the same bounces on a local cluster). Installs and
# starts Docker when none answers (as root), and stops only what it
# started. About 4 minutes warm, 5 the first time.
containers:
	@scripts/containers.sh --full

# Builds eoskit/kafka and eoskit/postgres (Debian packages and the Maven
# Central jars, no registry) when missing or stale; needs a running Docker.
images:
	@scripts/images.sh build

# Starts the local broker and PostgreSQL for working by hand; prints the
# variables to export.
services:
	@scripts/kafka.sh start
	@scripts/postgres.sh start

services-stop:
	@scripts/kafka.sh stop
	@scripts/postgres.sh stop

# Stops the broker and deletes its data (the downloaded jars stay cached).
clean-services:
	@scripts/kafka.sh clean

# Runs every pattern through the same faults on the local broker and
# PostgreSQL and prints what the verifier found.
demo:
	@scripts/with-services.sh go run ./cmd/eoslab

# Runs the full chaos matrix (every fault scenario on every exactly-once
# path, 100,000 records each, copiers as separate processes; the cluster
# scenarios on a private three-node cluster; the counting paths of keyed
# state, memory and pebble stores, and their negative control), then the
# soak (a million records and 30 mixed faults on the cluster, per copying
# path), then the outbox path's scenarios (relay processes, a PostgreSQL of
# its own), and prints the tables; make test runs one scenario per path
# (two for the outbox). Then eos.Processor through broker bounces on the
# cluster (a leader and a transaction coordinator SIGKILLed; make
# containers runs the same on broker containers), and every case of the
# standbys' take-over (make test runs its three SIGKILL cases).
# A run that passes puts its tables into docs/results/chaos.md, between the
# "make chaos" markers (scripts/results.sh); a failed one leaves the doc as
# it was. Takes about 9 hours: the soaks, slowed to 4 ms a record,
# about 2 h (61, 30 and 31 min for eos, offsetstore and dedup on
# 2026-12-04); the other rows' own times sum to 5.3 h, measured two
# or three runs at a time, and the consumer-protocol rows about 2 h
# more (about 1 min for a copier's fault, 6.5 min for a node killed,
# 15 min for a rolling restart, on 2026-12-05).
chaos:
	@mkdir -p .eoskit
	@rm -f .eoskit/chaos.md
	@EOSKIT_KAFKA_JVM_OPTS= scripts/with-services.sh bash -c 'EOS_CHAOS=full EOS_CHAOS_TABLE=$$PWD/.eoskit/chaos.md go test -count=1 -timeout 660m -run TestChaos ./tests/chaos; rc=$$?; cat .eoskit/chaos.md 2>/dev/null; EOS_CHAOS=full EOS_REQUIRE_SERVICES=1 go test -count=1 -timeout 20m -run "^(TestProcessorExactlyOnceThroughBrokerBouncesOnACluster|TestAStandbyTakesOverAKilledInstancesPartitionsWithTheTail)$$" ./eos || rc=1; exit $$rc'
	@scripts/results.sh "make chaos" docs/results/chaos.md .eoskit/chaos.md

# Runs only the soak of make chaos, and puts its table into docs/results/chaos.md
# (the "make soak" markers) when it passes. About 30 to 60 minutes a path
# (a million records at 4 ms a record on 4 partitions; eos the slowest).
soak:
	@mkdir -p .eoskit
	@rm -f .eoskit/soak.md
	@EOSKIT_KAFKA_JVM_OPTS= scripts/with-services.sh bash -c 'EOS_CHAOS=soak EOS_CHAOS_TABLE=$$PWD/.eoskit/soak.md go test -count=1 -timeout 200m -run TestChaos ./tests/chaos; rc=$$?; cat .eoskit/soak.md 2>/dev/null; exit $$rc'
	@scripts/results.sh "make soak" docs/results/chaos.md .eoskit/soak.md

# Runs every eos test on Apache Kafka 3.9.1 (transaction protocol v1) as
# well; make test runs the protocol-dependent fault tests there. About 6
# minutes.
compat:
	@scripts/compat.sh --full

# Reproduces the broker bug KAFKA-20734 (docs/KAFKA-20734.md), which is not
# eoskit's: plain franz-go transactional copiers on a private single-node
# Apache Kafka 4.4.0, the broker restarted four times mid-copy; prints the
# markers the broker dropped, the transactions left hanging and what a
# read_committed reader lost or saw twice. Up to 3 runs of about 3 minutes.
# EOSKIT_KAFKA_VERSION=4.0.2 runs the same on a release without the bug.
repro-kafka-20734:
	@EOS_REQUIRE_SERVICES=1 EOS_REPRO_KAFKA_20734=1 go test -count=1 -v -timeout 60m -run 'TestReproduceKafka20734' ./tests/chaos

# Measures each guarantee against its baseline on the local broker and
# PostgreSQL and prints markdown tables (throughput, p50/p99 latency,
# peak heap, each as a ratio to the path's at-least-once baseline):
# eos.Processor against an at-least-once loop and a raw franz-go
# GroupTransactSession, Kafka Streams' exactly-once count by key (a Java
# peer that scripts/streams.sh builds from Maven Central's kafka-streams
# 4.4.0 jars) against eos.Processor's copy of the same keyed input,
# the count by key timed from its start over a 6,000,000-record backlog
# (eos.Count against Kafka Streams with one and two threads, about 4
# minutes), restores of a changelog (eos.Processor's and the peer's of one topic),
# a counter SIGKILLed and restarted, one of three counting instances
# leaving (with and without standbys, eos.Processor's and the peer's),
# offsetstore against an auto-committing consumer, dedup against the same
# consumer without the claim, outbox.Relay against an at-least-once relay
# and an idempotent producer; then dedup's claim cost as the ids table
# grows to 10 million. A run that passes puts its tables into
# docs/results/performance.md, between the "make bench" markers
# (scripts/results.sh); the progress lines go to stderr only. Takes about
# 65 minutes (52 on 2026-12-04, before the restart and rolling parts,
# about 5 and 9 minutes).
bench:
	@mkdir -p .eoskit
	@rm -f .eoskit/bench.md
	@scripts/with-services.sh bash -c 'set -o pipefail; go run ./tools/bench | tee .eoskit/bench.md'
	@scripts/results.sh "make bench" docs/results/performance.md .eoskit/bench.md

