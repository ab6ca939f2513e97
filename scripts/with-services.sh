#!/usr/bin/env bash
# Runs a command with the local Apache Kafka broker and PostgreSQL up:
# starts each unless KAFKA_BROKERS / DATABASE_URL already name a running one
# (reusing a broker or cluster that is already running), exports those
# variables and EOS_REQUIRE_SERVICES=1 to the command, and stops whatever it
# started when the command ends, pass or fail.
#
#   scripts/with-services.sh go test ./...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=()
state=${EOSKIT_STATE_DIR:-.eoskit}/postgres
stop_started() {
	local s
	for s in ${started[@]+"${started[@]}"}; do
		scripts/"$s".sh stop || true
	done
	# A test role this run's start made (a start that failed after
	# making it included) in a cluster this run did not start, which
	# stop would have dropped: dropped too, unless another session uses it.
	if [ -f "$state/role-made-by-last-start" ] && [[ " ${started[*]-} " != *" postgres "* ]]; then
		scripts/postgres.sh drop-role --if-idle || true
	fi
	rm -f "$state/role-made-by-last-start"
}
trap stop_started EXIT

# redacted prints its argument with a URL's password replaced by ***: the
# lines go to CI logs.
redacted() { sed -E 's#(://[^:/@]*):[^@]*@#\1:***@#g' <<<"$1"; }

# use_service NAME VAR starts scripts/NAME.sh unless VAR is set, remembers
# whether this run started it, and exports the VAR=... line the script prints.
use_service() {
	local name=$1 var=$2 line
	if [ -n "${!var:-}" ]; then
		echo "with-services: using $(redacted "$var=${!var}")"
		return 0
	fi
	scripts/"$name".sh status >/dev/null 2>&1 || started+=("$name")
	line=$(scripts/"$name".sh start | tail -n 1)
	[ "${line%%=*}" = "$var" ] || { echo "with-services: scripts/$name.sh start printed '$line', not $var=..." >&2; exit 1; }
	export "${line?}"
	echo "with-services: $(redacted "$line")"
}

use_service kafka KAFKA_BROKERS
rm -f "$state/role-made-by-last-start"
use_service postgres DATABASE_URL
export EOS_REQUIRE_SERVICES=1
"$@"
