#!/usr/bin/env bash
# Runs a three-node Apache Kafka cluster (KRaft; each node a combined broker
# and controller) on 127.0.0.1 for eoskit's fault tests: replication factor
# 3 and min.insync.replicas=2 for data and internal topics, no unclean
# leader election, transaction protocol v2, and Kafka's default 50 partitions
# for __consumer_offsets and __transaction_state. A restart of one node then moves
# leadership instead of leaving partitions leaderless (which a single broker
# cannot avoid, and which Kafka 4.1-4.4 answers by dropping transaction
# markers, KAFKA-20734). Same jars and cache as scripts/kafka.sh.
#
#   scripts/kafka-cluster.sh start             start every node (reusing running ones); prints KAFKA_BROKERS=a,b,c
#   scripts/kafka-cluster.sh stop [N]          SIGTERM node N (1-3), or every node, and wait until gone
#   scripts/kafka-cluster.sh kill N            SIGKILL node N, as a crash would
#   scripts/kafka-cluster.sh pause N           SIGSTOP node N (a hung broker); resume N sends SIGCONT
#   scripts/kafka-cluster.sh start-node N      start node N again on its data and ports
#   scripts/kafka-cluster.sh restart N [--hard]  stop (or kill) node N, start it, wait until every replica is in sync
#   scripts/kafka-cluster.sh rolling-restart [--hard]  restart the nodes one by one, each after the cluster is whole
#   scripts/kafka-cluster.sh status            each node's state; exit 0 if all run
#   scripts/kafka-cluster.sh env               print KAFKA_BROKERS=...
#   scripts/kafka-cluster.sh clean             stop every node and delete the cluster's data
#
# Environment: as scripts/kafka.sh (EOSKIT_CACHE_DIR, EOSKIT_STATE_DIR, whose
# cluster/ folder holds node1..node3, JAVA_HOME, EOSKIT_OWNER_PID,
# EOSKIT_KAFKA_VERSION, EOSKIT_KAFKA_SASL).
set -euo pipefail

# The cluster has no TLS listener (scripts/kafka.sh's EOSKIT_KAFKA_TLS is
# for a single broker): refuse rather than start a SASL_PLAINTEXT one.
[ "${EOSKIT_KAFKA_TLS:-}" != 1 ] || { echo "kafka-cluster.sh: EOSKIT_KAFKA_TLS is for scripts/kafka.sh's single broker; the cluster has no TLS listener" >&2; exit 2; }
# shellcheck source=scripts/kafka.sh
source "$(dirname "${BASH_SOURCE[0]}")/kafka.sh"
log() { echo "kafka-cluster.sh: $*" >&2; }

NODES=3
CLUSTER_DIR=${EOSKIT_STATE_DIR:-$ROOT/.eoskit}/cluster
# The shared folder is per version; a private one (EOSKIT_STATE_DIR) is the caller's.
[ -n "${EOSKIT_STATE_DIR:-}" ] || [ "$KAFKA_VERSION" = "$DEFAULT_KAFKA_VERSION" ] || CLUSTER_DIR+=-$KAFKA_VERSION
[ -n "${EOSKIT_STATE_DIR:-}" ] || [ "${EOSKIT_KAFKA_SASL:-}" != 1 ] || CLUSTER_DIR+=-sasl

# use_node N points kafka.sh's functions (running_pid, stop_with) at node N.
use_node() {
	case "$1" in 1 | 2 | 3) ;; *) die "no node '$1': nodes are 1 to $NODES" ;; esac
	STATE_DIR=$CLUSTER_DIR/node$1
	PID_FILE=$STATE_DIR/kafka.pid
}

bootstrap_all() { cat "$CLUSTER_DIR/bootstrap"; }

# configure_cluster runs once per state folder: ports chosen now stay fixed,
# so a restarted node comes back on its address.
configure_cluster() {
	[ -f "$CLUSTER_DIR/bootstrap" ] && return 0
	mkdir -p "$CLUSTER_DIR"
	# Four ports a node: its broker listener (BROKER, which the brokers
	# and the bootstrap addresses use), its controller, and a CLIENT
	# listener that advertises a fourth port, where a test's network-cut
	# proxy listens (testbed.LocalCluster.Proxied; proxies lists them).
	local ports voters="" brokers="" i
	read -r -a ports <<<"$(eosdev freeport $((4 * NODES)))"
	: >"$CLUSTER_DIR/proxies.tmp"
	for i in $(seq 1 $NODES); do
		voters+="${voters:+,}$i@127.0.0.1:${ports[4 * i - 3]}"
		brokers+="${brokers:+,}127.0.0.1:${ports[4 * i - 4]}"
		echo "$i 127.0.0.1:${ports[4 * i - 1]} 127.0.0.1:${ports[4 * i - 2]}" >>"$CLUSTER_DIR/proxies.tmp"
	done
	local cluster_id
	cluster_id=$(new_cluster_id)
	# With EOSKIT_KAFKA_SASL=1, as scripts/kafka.sh, on both the broker
	# and the proxied listener.
	local proto=PLAINTEXT
	SECURITY="" SCRAM=()
	if [ "${EOSKIT_KAFKA_SASL:-}" = 1 ]; then
		proto=SASL_PLAINTEXT
		sasl_config "$CLUSTER_DIR" broker client
	fi
	for i in $(seq 1 $NODES); do
		use_node "$i"
		mkdir -p "$STATE_DIR/data" "$STATE_DIR/logs"
		cat >"$STATE_DIR/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
listeners=BROKER://127.0.0.1:${ports[4 * i - 4]},CONTROLLER://127.0.0.1:${ports[4 * i - 3]},CLIENT://127.0.0.1:${ports[4 * i - 2]}
advertised.listeners=BROKER://127.0.0.1:${ports[4 * i - 4]},CLIENT://127.0.0.1:${ports[4 * i - 1]}
listener.security.protocol.map=BROKER:$proto,CONTROLLER:PLAINTEXT,CLIENT:$proto
inter.broker.listener.name=BROKER
controller.listener.names=CONTROLLER
controller.quorum.voters=$voters
log.dirs=$STATE_DIR/data
num.partitions=1
auto.create.topics.enable=false
# Every partition, data or internal, has three replicas and needs two in
# sync to take a write; a replica that fell behind never becomes leader.
# The internal topics have Kafka's default 50 partitions, as production
# clusters do: where a group's offsets or a transactional id's state live
# (Utils.abs(hash) % 50) is then as it is there, which one partition hides.
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=50
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=50
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# Consumer-protocol (KIP-848) groups: a 1 s heartbeat and a 6 s session, so
# that their tests see a change within seconds (defaults: 5 s and 45 s).
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=6000
group.consumer.min.session.timeout.ms=6000$SECURITY
EOF
		echo "127.0.0.1:${ports[4 * i - 4]}" >"$STATE_DIR/bootstrap"
		write_log4j
		# shellcheck disable=SC2046,SC2086 # the flag is two words; options, split on spaces
		"$JAVA" ${EOSKIT_KAFKA_JVM_OPTS:-} -cp "$LIB_DIR/*" -Dlog4j2.configurationFile="$STATE_DIR/log4j2.properties" \
			kafka.tools.StorageTool format -t "$cluster_id" -c "$STATE_DIR/server.properties" \
			$(format_features) ${SCRAM[@]+"${SCRAM[@]}"} >"$STATE_DIR/logs/format.log" 2>&1 ||
			{ cat "$STATE_DIR/logs/format.log" >&2; rm -rf "$CLUSTER_DIR"; die "storage format of node $i failed"; }
		echo "$KAFKA_VERSION" >"$STATE_DIR/version"
	done
	rm -f "$CLUSTER_DIR/scram.args"
	mv "$CLUSTER_DIR/proxies.tmp" "$CLUSTER_DIR/proxies"
	echo "$brokers" >"$CLUSTER_DIR/bootstrap"
}

# start_node N starts node N unless it runs, without waiting.
start_node() {
	use_node "$1"
	if pid=$(running_pid); then
		return 0
	fi
	log "starting node $1 (log: $STATE_DIR/logs/server.log)"
	launch_broker 384m
}

# wait_whole [N] waits until node N (when given) answers Metadata itself,
# every node is a live broker, and every replica of every partition is in
# sync. Asking node N itself matters: the others list a killed node until
# its session times out, and keep it in the ISR for replica.lag.time.max.ms.
wait_whole() {
	local sasl=()
	[ -f "$CLUSTER_DIR/admin.sasl" ] && sasl=(-sasl-file "$CLUSTER_DIR/admin.sasl")
	if [ -n "${1:-}" ]; then
		"$CLUSTER_DIR/eosdev" wait-kafka -brokers "$(cat "$CLUSTER_DIR/node$1/bootstrap")" -node-id "$1" -timeout 120s ${sasl[@]+"${sasl[@]}"} ||
			{ tail -n 40 "$CLUSTER_DIR/node$1/logs/server.log" >&2; die "node $1 did not come back"; }
	fi
	"$CLUSTER_DIR/eosdev" wait-kafka -brokers "$(bootstrap_all)" -min-brokers $NODES -timeout 120s ${sasl[@]+"${sasl[@]}"} &&
		"$CLUSTER_DIR/eosdev" wait-isr -brokers "$(bootstrap_all)" -timeout 180s ${sasl[@]+"${sasl[@]}"} && return 0
	local i
	for i in $(seq 1 $NODES); do tail -n 20 "$CLUSTER_DIR/node$i/logs/server.log" >&2 || true; done
	die "the cluster did not become whole"
}

start_all() {
	if [ -f "$CLUSTER_DIR/node1/version" ] && [ "$(cat "$CLUSTER_DIR/node1/version")" != "$KAFKA_VERSION" ]; then
		die "$CLUSTER_DIR holds Apache Kafka $(cat "$CLUSTER_DIR/node1/version"), not $KAFKA_VERSION: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ -f "$CLUSTER_DIR/node1/server.properties" ] && ! grep -q '^offsets.topic.num.partitions=50$' "$CLUSTER_DIR/node1/server.properties"; then
		die "$CLUSTER_DIR holds a cluster made before the internal topics had Kafka's default 50 partitions: clean it (scripts/kafka-cluster.sh clean)"
	fi
	if [ "${EOSKIT_KAFKA_SASL:-}" = 1 ] && [ -f "$CLUSTER_DIR/bootstrap" ] && [ ! -f "$CLUSTER_DIR/admin.sasl" ]; then
		die "$CLUSTER_DIR holds a cluster without SASL: clean it, or use another EOSKIT_STATE_DIR"
	fi
	command -v "$JAVA" >/dev/null || die "java not found: install a JDK 17+ or set JAVA_HOME"
	fetch_jars
	configure_cluster
	(cd "$ROOT" && go build -o "$CLUSTER_DIR/eosdev" ./tools/eosdev)
	local i
	for i in $(seq 1 $NODES); do start_node "$i"; done
	wait_whole
	log "cluster ready at $(bootstrap_all)"
	echo "KAFKA_BROKERS=$(bootstrap_all)"
}

signal_node() {
	use_node "$1"
	local pid
	pid=$(running_pid) || die "node $1 is not running"
	kill -s "$2" "$pid"
}

# stop_all stops every node: SIGCONT (a paused node ignores SIGTERM), then
# SIGTERM to all at once (a controller left without a quorum would wait for
# one), then waits for each.
stop_all() {
	local i pid
	for i in $(seq 1 $NODES); do
		use_node "$i"
		if pid=$(running_pid); then kill -s CONT "$pid" 2>/dev/null && kill -s TERM "$pid" 2>/dev/null || true; fi
	done
	for i in $(seq 1 $NODES); do use_node "$i"; stop_with TERM; done
}

restart_node() {
	use_node "$1"
	if [ "${2:-}" = "--hard" ]; then stop_with KILL; else stop_with TERM; fi
	start_node "$1"
	wait_whole "$1"
}

case "${1:-}" in
start) start_all ;;
stop)
	if [ -n "${2:-}" ]; then
		use_node "$2"
		stop_with TERM
	else
		stop_all
	fi
	;;
kill) use_node "${2:?node}" && stop_with KILL ;;
pause) signal_node "${2:?node}" STOP ;;
resume) signal_node "${2:?node}" CONT ;;
start-node)
	start_node "${2:?node}"
	wait_whole "$2"
	;;
restart) restart_node "${2:?node}" "${3:-}" ;;
rolling-restart)
	for i in $(seq 1 $NODES); do restart_node "$i" "${2:-}"; done
	;;
status)
	all=0
	for i in $(seq 1 $NODES); do
		use_node "$i"
		if pid=$(running_pid); then
			state=$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null || echo '?')
			echo "node $i: running (pid $pid, state $state)"
		else
			echo "node $i: not running"
			all=1
		fi
	done
	[ -f "$CLUSTER_DIR/bootstrap" ] && echo "bootstrap: $(bootstrap_all)"
	exit $all
	;;
env)
	[ -f "$CLUSTER_DIR/bootstrap" ] || die "no cluster configured"
	echo "KAFKA_BROKERS=$(bootstrap_all)"
	;;
clean)
	stop_all
	rm -rf "$CLUSTER_DIR"
	;;
*)
	sed -n '2,22p' "$0" >&2
	exit 2
	;;
esac
