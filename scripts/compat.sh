#!/usr/bin/env bash
# Runs eos's tests against another Apache Kafka release than the one the
# suite is proven on (4.4.0): by default 3.9.1, the last release with only
# transaction protocol v1, where an epoch spans many transactions and the
# hanging-transaction check must not assume v2. Starts that version's
# broker beside any other (its own state folder, scripts/kafka.sh with
# EOSKIT_KAFKA_VERSION), and private brokers and clusters of that version
# for the fault tests, and stops them at the end.
#
#   scripts/compat.sh           the fault tests that depend on the protocol (make test runs these)
#   scripts/compat.sh --full    every eos test (make compat)
#
# EOSKIT_COMPAT_KAFKA_VERSION picks another release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=${EOSKIT_COMPAT_KAFKA_VERSION:-3.9.1}
tests=(TestProcessorCrashMidTransactionLosesAndDuplicatesNothing TestProcessorZombieIsFenced
	TestProcessorAtHangingTransactions TestProcessorSurvivesBrokerHardRestart
	TestProcessorAbortsPredecessorsOpenTransactionAtStart)
run="^($(IFS='|'; echo "${tests[*]}"))\$"
if [ "${1:-}" = "--full" ]; then
	run=.
else
	# A test renamed or removed would drop out silently (-run matches
	# nothing and passes): each listed test must exist.
	listed=$(go test -list "$run" ./eos) || { echo "compat.sh: go test -list failed: $listed" >&2; exit 1; }
	for t in "${tests[@]}"; do
		grep -qx "$t" <<<"$listed" || { echo "compat.sh: no test $t in ./eos" >&2; exit 1; }
	done
fi
echo "compat.sh: eos tests ($run) on Apache Kafka $version"
# Four tests at a time, as make test's run of eos: they wait on brokers
# and transaction timeouts, not on the CPU (go test's default is
# GOMAXPROCS, two here).
env -u KAFKA_BROKERS EOSKIT_KAFKA_VERSION="$version" \
	scripts/with-services.sh go test -race -count=1 -parallel 4 -timeout 30m -run "$run" ./eos
