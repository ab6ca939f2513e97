#!/usr/bin/env bash
# Fails if a process that this test run started (a private broker, its
# watchdog, a copier or loader process) is still running once the tests are
# over. scripts/test.sh gives each run a token in EOSKIT_TEST_RUN; every
# process a test starts carries EOSKIT_STARTED_BY_TEST=<that token> in its
# environment, so another run's processes on the same machine are left
# alone. Watchdogs stop a private broker whose test binary died, so this
# waits up to 45 s for them first; whatever is left after that is listed,
# killed, and fails the run.
#
#   EOSKIT_TEST_RUN=<token> scripts/leftovers.sh
set -euo pipefail

token=${EOSKIT_TEST_RUN:?leftovers.sh: set EOSKIT_TEST_RUN to the test run token}

leftovers() {
	local environ pid
	for environ in /proc/[0-9]*/environ; do
		pid=${environ#/proc/}
		pid=${pid%/environ}
		[ "$pid" = "$$" ] && continue
		if grep -qzx "EOSKIT_STARTED_BY_TEST=$token" "$environ" 2>/dev/null; then
			echo "$pid"
		fi
	done
}

for _ in $(seq 1 90); do
	[ -z "$(leftovers)" ] && exit 0
	sleep 0.5
done
echo "leftovers.sh: processes started by tests are still running after the tests ended:" >&2
for pid in $(leftovers); do
	echo "  pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-200)" >&2
	kill -KILL "$pid" 2>/dev/null || true
done
exit 1
