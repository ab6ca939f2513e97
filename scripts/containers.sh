#!/usr/bin/env bash
# The containers suite of make test: eoskit's tests with Kafka and
# PostgreSQL in Docker containers, started through testcontainers-go
# (package integration, the test kit), instead of the services the scripts
# start.
#
#   scripts/containers.sh
#
# It makes a Docker engine answer (scripts/docker.sh: Debian's docker.io,
# installed and started when missing), builds the images when they are
# missing or stale (scripts/images.sh: no registry needed), and runs, with
# KAFKA_BROKERS and DATABASE_URL unset so that every service comes from a
# container:
#   - every TestContainer* test of the kit (one broker stopped, killed,
#     started, replaced on its volume and paused, three nodes with one
#     stopped, PostgreSQL, the docs' example test with the reaper left to
#     the kit), and the docs' example test itself;
#   - the kit's foundation smoke tests;
#   - one exactly-once test per path (eos, offsetstore, dedup).
#
#   scripts/containers.sh --full
#
# (make containers) also runs eos through broker containers stopped,
# started and replaced mid-run: three broker containers beside the kit's
# own three-node test, the suite's longest test (make chaos runs the same
# bounces on a local three-node cluster).
# Containers run on the host's network (EOSKIT_DOCKER_NETWORK=host), and
# Ryuk, whose image no registry here serves, is off: every container is
# terminated by its test, and any container or volume this run labelled
# that is left afterwards fails the suite. It stops the engine only if it started it, and
# prints how long the images and the suite took.
#
#   scripts/containers.sh prepare
#
# only makes the engine answer and builds the images, and leaves an engine
# it started running (scripts/docker.sh's pid file names it, so the next
# scripts/containers.sh stops it): make test prepares while its other
# tests run, since on a fresh machine installing Docker and building the
# images is minutes of downloading and unpacking.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { echo "containers.sh: $*" >&2; }

case "${1:-}" in
"" | prepare | --full) ;;
*)
	log "unknown argument $1 (none, prepare or --full)"
	exit 2
	;;
esac

run=${EOSKIT_TEST_RUN:-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')}
export EOSKIT_TEST_RUN=$run

# Stops the engine only if it is ours (docker.sh stop checks), also when
# its start failed half-way.
started=unknown
stop_docker() { [ "$started" = DOCKER_STARTED=no ] || scripts/docker.sh stop; }
trap stop_docker EXIT
started=$(scripts/docker.sh start | tail -n 1)

t0=$SECONDS
# Prepared beside the other tests, the images build at the lowest
# priority (the engine does not: its containers would inherit it).
low=()
if [ "${1:-}" = prepare ]; then
	low=(nice -n 19)
	if command -v ionice >/dev/null; then low+=(ionice -c 3); fi
fi
images=$("${low[@]}" scripts/images.sh build)
log "images ready in $((SECONDS - t0)) s"
if [ "${1:-}" = prepare ]; then
	trap - EXIT
	exit 0
fi
for line in $images; do export "${line?}"; done

export EOSKIT_CONTAINERS=1 EOSKIT_DOCKER_NETWORK=host TESTCONTAINERS_RYUK_DISABLED=true EOS_REQUIRE_SERVICES=1
unset KAFKA_BROKERS DATABASE_URL
t0=$SECONDS
rc=0
# One go test, so that its packages run side by side.
packages=(./integration ./eos ./offsetstore ./dedup)
tests=(TestDocsShowTheExampleTest TestRunKafkaRefusesAClusterWithoutTheHostNetwork TestContainerKafkaKeepsItsDataOnItsVolume
	TestContainerClusterOfThreeCommitsThroughAStoppedNode TestContainerPostgresLetsItsRoleCreateDatabases TestContainerPostgresRunsTheOutbox TestOrdersAreReadBack
	TestContainerRyukIsTurnedOffWhereItsImageCannotBeHad
	TestSmokeIdempotentProducerWritesEachRecordOnce TestSmokeTransactionAcrossPartitionsIsAtomic
	TestSmokeAbortedTransactionIsInvisibleToReadCommitted TestSmokeSecondProducerWithSameTransactionalIDFencesTheFirst
	TestPostgresGivesEachTestItsOwnDatabase TestProcessorCrashMidTransactionLosesAndDuplicatesNothing
	TestAbortedInputsAreNeverApplied)
if [ "${1:-}" = --full ]; then
	tests+=(TestProcessorExactlyOnceThroughBrokerContainerStopAndStart)
fi
pattern="^($(IFS='|'; echo "${tests[*]}"))\$"
# A test renamed or removed would drop out of the suite silently (-run
# matching nothing passes): each name must match in some package.
# (-race: the run below reuses what this builds.)
listed=$(go test -race -list "$pattern" "${packages[@]}") || { log "go test -list failed: $listed"; exit 1; }
listed=$(grep '^Test' <<<"$listed" | sort -u || true)
for t in "${tests[@]}"; do
	grep -qx "$t" <<<"$listed" || { log "no test $t in ${packages[*]}"; rc=1; }
done
# And every TestContainer* test of the kit is in the list.
for t in $(grep '^Test' <<<"$(go test -race -list '^TestContainer' ./integration)"); do
	[[ " ${tests[*]} " == *" $t "* ]] || { log "the kit's $t is not in the containers suite's list"; rc=1; }
done
go test -race -count=1 -timeout 15m -run "$pattern" "${packages[@]}" || rc=$?
log "suite ran in $((SECONDS - t0)) s"

left=$(timeout 60 docker ps -aq --filter "label=org.eoskit.integration=$run")
if [ -n "$left" ]; then
	log "containers of this run are still there after its tests:"
	timeout 60 docker ps -a --filter "label=org.eoskit.integration=$run" >&2
	# shellcheck disable=SC2086 # ids are words
	timeout 120 docker rm -f -v $left >/dev/null || true
	rc=1
fi
left=$(timeout 60 docker volume ls -q --filter "label=org.eoskit.integration=$run")
if [ -n "$left" ]; then
	log "volumes of this run are still there after its tests: $left"
	# shellcheck disable=SC2086 # names are words
	timeout 120 docker volume rm -f $left >/dev/null || true
	rc=1
fi
exit "$rc"
