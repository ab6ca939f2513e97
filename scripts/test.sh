#!/usr/bin/env bash
# The project's one test command (run it as `make test`): starts a local
# Apache Kafka broker and PostgreSQL unless KAFKA_BROKERS / DATABASE_URL
# already name running ones, requires them (EOS_REQUIRE_SERVICES=1, so a
# missing service fails instead of skipping), checks formatting and vet, runs
# every test under the race detector, and stops whatever it started, pass or
# fail.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=()
stop_started() {
	local s
	for s in "${started[@]}"; do
		scripts/"$s".sh stop || true
	done
}
trap stop_started EXIT

# use_service NAME VAR starts scripts/NAME.sh unless VAR is set, remembers
# whether this run started it, and exports the VAR=... line the script prints.
use_service() {
	local name=$1 var=$2 line
	if [ -n "${!var:-}" ]; then
		echo "test.sh: using $var=${!var}"
		return 0
	fi
	scripts/"$name".sh status >/dev/null 2>&1 || started+=("$name")
	line=$(scripts/"$name".sh start | tail -n 1)
	[ "${line%%=*}" = "$var" ] || { echo "test.sh: scripts/$name.sh start printed '$line', not $var=..." >&2; exit 1; }
	export "$line"
	echo "test.sh: $line"
}

use_service kafka KAFKA_BROKERS
use_service postgres DATABASE_URL
export EOS_REQUIRE_SERVICES=1

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "test.sh: not gofmt-formatted:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...
go test -race -count=1 -timeout 25m ./...
