#!/usr/bin/env bash
# Fails if a process that a test started (a private broker, a copier or
# loader process: each carries EOSKIT_STARTED_BY_TEST=1 in its environment)
# is still running once the tests are over. Watchdogs stop a private broker
# whose test binary died, so this waits up to 45 s for them first; whatever
# is left after that is listed, killed, and fails the run.
#
#   scripts/leftovers.sh
set -euo pipefail

leftovers() {
	local environ pid
	for environ in /proc/[0-9]*/environ; do
		pid=${environ#/proc/}
		pid=${pid%/environ}
		[ "$pid" = "$$" ] && continue
		if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx 'EOSKIT_STARTED_BY_TEST=1'; then
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
