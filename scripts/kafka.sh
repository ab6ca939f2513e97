#!/usr/bin/env bash
# Runs one real Apache Kafka broker (combined KRaft broker + controller) on
# 127.0.0.1 for eoskit's tests, from the Apache Kafka jars on Maven Central.
#
#   scripts/kafka.sh start          start (or reuse a running broker); prints KAFKA_BROKERS=...
#   scripts/kafka.sh stop           SIGTERM, wait for a clean shutdown (SIGKILL after 60 s)
#   scripts/kafka.sh kill           SIGKILL, as a crash would
#   scripts/kafka.sh restart [--hard]   stop (or kill) and start again on the same data and ports
#   scripts/kafka.sh status         exit 0 if running, and print the bootstrap address
#   scripts/kafka.sh env            print KAFKA_BROKERS=... for a running broker
#   scripts/kafka.sh clean          stop and delete the broker's data
#
# Environment:
#   EOSKIT_CACHE_DIR  where the jars are kept between runs (default ~/.cache/eoskit)
#   EOSKIT_STATE_DIR  where the broker's config, data, pid and log live
#                     (default <repo>/.eoskit); its log is kafka/logs/server.log
#   JAVA_HOME         the JDK to run the broker with (Java 17+); default: java on PATH
#   EOSKIT_KAFKA_VERSION  the Apache Kafka release to run (default 4.4.0; 3.9.x
#                     runs transaction protocol v1, 4.x is formatted with v2).
#                     Each version has its own jars and, unless 4.4.0 or
#                     EOSKIT_STATE_DIR is set, its own state folder (kafka-VERSION)
#   EOSKIT_KAFKA_SASL=1  configure the broker (when its state folder is new) to
#                     authenticate every client with SASL/SCRAM-SHA-512 and
#                     authorize every request (StandardAuthorizer, no ACL no
#                     access); the super user is admin, its password in the
#                     state folder's kafka/admin.sasl (user, then password).
#                     The shared folder is then kafka-sasl, apart from the
#                     plaintext broker make test uses
#   EOSKIT_KAFKA_TLS=1   as EOSKIT_KAFKA_SASL=1, on a SASL_SSL listener: the
#                     broker's certificate (for 127.0.0.1 and localhost)
#                     is signed by a CA made for the state folder, whose
#                     certificate clients trust: kafka/tls/ca.pem. A second
#                     listener takes mutual TLS (kafka/bootstrap-mtls): a
#                     client presents kafka/tls/client.pem and client.key,
#                     signed by that CA, as principal User:CN=eoskit-client.
#                     SASL_SSL also takes OAUTHBEARER: a JWT signed (RS256)
#                     by kafka/tls/oauth.key, with the kid, issuer and
#                     audience of kafka/tls/oauth.claims; its sub claim is
#                     the principal. The shared folder is then kafka-tls
#   EOSKIT_OWNER_PID  when set (tests set it to their own pid), a watchdog stops
#                     the broker once that process is gone, however it ended
#   EOSKIT_KAFKA_JVM_OPTS  more options for the broker's JVM and its storage
#                     format (the tests' private brokers get
#                     -XX:TieredStopAtLevel=1 from testsupport/testbed)
set -euo pipefail

DEFAULT_KAFKA_VERSION=4.4.0
KAFKA_VERSION=${EOSKIT_KAFKA_VERSION:-$DEFAULT_KAFKA_VERSION}
[[ $KAFKA_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "kafka.sh: EOSKIT_KAFKA_VERSION=$KAFKA_VERSION is not a release (x.y.z)" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${EOSKIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eoskit}
LIB_DIR=$CACHE_DIR/kafka-$KAFKA_VERSION/lib
STATE_DIR=${EOSKIT_STATE_DIR:-$ROOT/.eoskit}/kafka
# Absolute: the broker's JWKS URL (file://...) and eosdev, which runs in
# $ROOT, name files under it.
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
# The shared folder is per version; a private one (EOSKIT_STATE_DIR) is the caller's.
[ -n "${EOSKIT_STATE_DIR:-}" ] || [ "$KAFKA_VERSION" = "$DEFAULT_KAFKA_VERSION" ] || STATE_DIR+=-$KAFKA_VERSION
[ "${EOSKIT_KAFKA_TLS:-}" != 1 ] || EOSKIT_KAFKA_SASL=1
if [ -z "${EOSKIT_STATE_DIR:-}" ] && [ "${EOSKIT_KAFKA_TLS:-}" = 1 ]; then
	STATE_DIR+=-tls
elif [ -z "${EOSKIT_STATE_DIR:-}" ] && [ "${EOSKIT_KAFKA_SASL:-}" = 1 ]; then
	STATE_DIR+=-sasl
fi
PID_FILE=$STATE_DIR/kafka.pid
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java

log() { echo "kafka.sh: $*" >&2; }
die() { log "$*"; exit 1; }

eosdev() { (cd "$ROOT" && go run ./tools/eosdev "$@"); }

# shellcheck source=maven-jars.sh
. "$ROOT/scripts/maven-jars.sh"

# fetch_jars downloads the broker's runtime classpath once.
fetch_jars() {
	maven_jars "$ROOT/scripts/kafka/pom.xml" "$LIB_DIR" "org.apache.kafka:kafka_2.13:$KAFKA_VERSION" -Dkafka.version="$KAFKA_VERSION"
}

running_pid() {
	[ -f "$PID_FILE" ] || return 1
	local pid
	pid=$(cat "$PID_FILE")
	kill -0 "$pid" 2>/dev/null || return 1
	echo "$pid"
}

bootstrap() { cat "$STATE_DIR/bootstrap"; }

# format_features is StorageTool's feature flag: transaction protocol v2
# (KIP-890, the 4.x default) set explicitly on 4.x, so that a future default
# can not silently change what the fencing tests exercise; 3.x has only v1.
format_features() {
	case "$KAFKA_VERSION" in
	3.*) ;;
	*) echo --feature transaction.version=2 ;;
	esac
}

# write_log4j writes the logging config of the broker in $STATE_DIR: INFO,
# to logs/server.log.
write_log4j() {
	cat >"$STATE_DIR/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $STATE_DIR/logs/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.zk.name = org.apache.zookeeper
logger.zk.level = WARN
EOF
}

# new_cluster_id prints a cluster id as StorageTool random-uuid does (16
# random bytes, base64url without padding, not starting with "-"), without
# starting a JVM for it.
new_cluster_id() {
	local id
	while :; do
		id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
		[[ $id == -* ]] || break
	done
	echo "$id"
}

# jwks_url is the URL of the OAUTHBEARER key set of a TLS broker's folder.
# Kafka takes it as a URI, and allowed.urls is a comma-separated list: a
# folder whose path would need escaping is refused.
jwks_url() {
	[[ $STATE_DIR =~ ^[A-Za-z0-9/._+-]+$ ]] || die "$STATE_DIR: a TLS broker's folder path may hold only letters, digits and / . _ + - (it goes into a file: URL)"
	echo "file://$STATE_DIR/tls/jwks.json"
}

# launch_broker HEAP starts the broker of $STATE_DIR in the background and
# records its pid. setsid: the broker must not get the terminal's signals
# (a Ctrl-C on make is handled by make's trap, which stops it cleanly).
# With EOSKIT_OWNER_PID set, a watchdog stops it once that process is gone.
launch_broker() {
	# The JWKS file's URL must be allowed (Kafka 4.0+); before
	# EOSKIT_KAFKA_JVM_OPTS, which may set it otherwise.
	local allowed=()
	[ -f "$STATE_DIR/tls/jwks.json" ] && allowed=("-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=$(jwks_url)")
	# shellcheck disable=SC2086 # options, split on spaces
	setsid "$JAVA" -Xms"$1" -Xmx"$1" -XX:+UseG1GC ${allowed[@]+"${allowed[@]}"} ${EOSKIT_KAFKA_JVM_OPTS:-} -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$STATE_DIR/log4j2.properties" \
		-Dkafka.logs.dir="$STATE_DIR/logs" \
		-cp "$LIB_DIR/*" kafka.Kafka "$STATE_DIR/server.properties" \
		>"$STATE_DIR/logs/stdout.log" 2>&1 </dev/null &
	echo $! >"$PID_FILE"
	[ -n "${EOSKIT_OWNER_PID:-}" ] && watch_owner "$EOSKIT_OWNER_PID" "$!"
	return 0
}

# sasl_config DIR LISTENER... readies a broker (or cluster) in DIR that
# authenticates every client (SCRAM-SHA-512) and authorizes every request
# (no ACL, no access). It picks a fresh password for the super user admin
# and keeps it in files only this user can read, never on a command line
# (where ps shows it): DIR/admin.sasl (user, then password) and
# DIR/scram.args, StorageTool's argument file, which the format removes.
# It sets SECURITY, the server.properties lines (the brokers' own traffic
# runs as admin; the controller listener, plaintext, loopback and never
# advertised, as ANONYMOUS; both are super users), with a JAAS entry for
# each SASL LISTENER name, and SCRAM, StorageTool's arguments.
sasl_config() {
	local dir=$1 pw jaas listener
	shift
	pw=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	umask 077
	chmod 700 "$dir"
	printf 'admin\n%s\n' "$pw" >"$dir/admin.sasl"
	printf '%s\n' --add-scram "SCRAM-SHA-512=[name=admin,password=$pw]" >"$dir/scram.args"
	SCRAM=("@$dir/scram.args")
	jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"$pw\";"
	SECURITY="
# Every client authenticates (SCRAM-SHA-512) and every request is authorized.
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512"
	for listener in "$@"; do
		SECURITY+="
listener.name.$listener.scram-sha-512.sasl.jaas.config=$jaas"
	done
	SECURITY+="
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:ANONYMOUS"
}

# tls_config DIR readies TLS for a broker in DIR: a CA of its own (DIR/tls/
# ca.pem, which clients trust; its key never leaves DIR/tls), a broker
# certificate for 127.0.0.1 and localhost signed by it, in a PKCS12
# keystore whose password stays in files only this user can read, and
# the server.properties lines, appended to SECURITY.
tls_config() {
	local tls=$1/tls pw url
	url=$(jwks_url) || exit 1
	command -v openssl >/dev/null || die "openssl not found: the TLS broker's certificates are made with it (apt-get install openssl)"
	umask 077
	mkdir -p "$tls"
	pw=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	printf '%s\n' "$pw" >"$tls/keystore.pw"
	# The folder may be reused for years: certificates for ten.
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tls/ca.key" -out "$tls/ca.pem" -days 3650 -subj "/CN=eoskit test CA" 2>>"$tls/openssl.log" ||
		die "openssl failed making the CA (its log: $tls/openssl.log)"
	openssl req -newkey rsa:2048 -nodes -keyout "$tls/broker.key" -out "$tls/broker.csr" -subj "/CN=localhost" 2>>"$tls/openssl.log" ||
		die "openssl failed making the broker's key (its log: $tls/openssl.log)"
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$tls/san.ext"
	openssl x509 -req -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
		-out "$tls/broker.pem" -days 3650 -extfile "$tls/san.ext" 2>>"$tls/openssl.log" ||
		die "openssl failed signing the broker's certificate (its log: $tls/openssl.log)"
	# A client's certificate, for the mutual-TLS listener: its principal
	# is User:CN=eoskit-client.
	openssl req -newkey rsa:2048 -nodes -keyout "$tls/client.key" -out "$tls/client.csr" -subj "/CN=eoskit-client" 2>>"$tls/openssl.log" &&
		openssl x509 -req -in "$tls/client.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
			-out "$tls/client.pem" -days 3650 2>>"$tls/openssl.log" ||
		die "openssl failed making the client's certificate (its log: $tls/openssl.log)"
	openssl pkcs12 -export -in "$tls/broker.pem" -inkey "$tls/broker.key" -certfile "$tls/ca.pem" \
		-out "$tls/broker.p12" -passout "file:$tls/keystore.pw" 2>>"$tls/openssl.log" ||
		die "openssl failed writing the keystore (its log: $tls/openssl.log)"
	# OAUTHBEARER: tokens signed (RS256) by a key of the folder's own,
	# whose public half is the JWKS file the broker trusts; the claims it
	# expects are in tls/oauth.claims (kid, issuer, audience).
	openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$tls/oauth.key" 2>>"$tls/openssl.log" ||
		die "openssl failed making the OAUTHBEARER signing key (its log: $tls/openssl.log)"
	eosdev jwks -key "$tls/oauth.key" -kid eoskit-test -out "$tls/jwks.json" ||
		die "could not write the OAUTHBEARER key set"
	printf 'kid=eoskit-test\nissuer=eoskit-test-issuer\naudience=eoskit-test-kafka\n' >"$tls/oauth.claims"
	chmod 644 "$tls/ca.pem" "$tls/jwks.json" "$tls/oauth.claims"
	SECURITY=${SECURITY/sasl.enabled.mechanisms=SCRAM-SHA-512/sasl.enabled.mechanisms=SCRAM-SHA-512,OAUTHBEARER}
	[[ $SECURITY == *sasl.enabled.mechanisms=SCRAM-SHA-512,OAUTHBEARER* ]] || die "tls_config: sasl_config's mechanisms line changed: OAUTHBEARER not enabled"
	SECURITY+="
# TLS (SASL_SSL): the broker's certificate is signed by the folder's own CA.
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls/broker.p12
ssl.keystore.password=$pw
ssl.key.password=$pw
ssl.truststore.type=PEM
ssl.truststore.location=$tls/ca.pem
# The MTLS listener (SSL) takes only clients whose certificate the CA
# signed; the principal is the certificate's subject.
listener.name.mtls.ssl.client.auth=required
# OAUTHBEARER beside SCRAM on SASL_SSL: a token counts only if the folder's
# key signed it, for this issuer and audience, and it has not expired; its
# sub claim is the principal. The JVM must also allow the JWKS file's URL
# (launch_broker sets org.apache.kafka.sasl.oauthbearer.allowed.urls).
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;
listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler
sasl.oauthbearer.jwks.endpoint.url=$url
sasl.oauthbearer.expected.issuer=eoskit-test-issuer
sasl.oauthbearer.expected.audience=eoskit-test-kafka"
}

# configure runs once per state folder: ports chosen now stay fixed for its
# life, so a restart comes back on the same address and clients reconnect.
configure() {
	[ -f "$STATE_DIR/server.properties" ] && return 0
	mkdir -p "$STATE_DIR/data" "$STATE_DIR/logs"
	local ports broker_port controller_port mtls_port
	ports=$(eosdev freeport 3)
	read -r broker_port controller_port mtls_port <<<"$ports"
	local proto=PLAINTEXT listeners advertised map
	SECURITY="" SCRAM=()
	if [ "${EOSKIT_KAFKA_TLS:-}" = 1 ]; then
		proto=SASL_SSL
		sasl_config "$STATE_DIR" sasl_ssl
		tls_config "$STATE_DIR"
	elif [ "${EOSKIT_KAFKA_SASL:-}" = 1 ]; then
		proto=SASL_PLAINTEXT
		sasl_config "$STATE_DIR" sasl_plaintext
	fi
	listeners=$proto://127.0.0.1:$broker_port advertised=$proto://127.0.0.1:$broker_port map=$proto:$proto
	if [ "${EOSKIT_KAFKA_TLS:-}" = 1 ]; then
		# Beside SASL_SSL, mutual TLS: a client certificate instead of a
		# password (kafka/bootstrap-mtls, kafka/tls/client.pem and .key).
		listeners+=",MTLS://127.0.0.1:$mtls_port" advertised+=",MTLS://127.0.0.1:$mtls_port" map+=",MTLS:SSL"
		echo "127.0.0.1:$mtls_port" >"$STATE_DIR/bootstrap-mtls"
	fi
	cat >"$STATE_DIR/server.properties" <<EOF
process.roles=broker,controller
node.id=1
listeners=$listeners,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=$advertised
listener.security.protocol.map=$map,CONTROLLER:PLAINTEXT
inter.broker.listener.name=$proto
controller.listener.names=CONTROLLER
controller.quorum.bootstrap.servers=127.0.0.1:$controller_port
log.dirs=$STATE_DIR/data
num.partitions=1
auto.create.topics.enable=false
# One broker: every internal topic must live with replication factor 1, or
# transactions and consumer groups never become available.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
# Tests start groups constantly; the production default waits 3 s first.
group.initial.rebalance.delay.ms=0
# Zombie tests stall a member past its session timeout; let them use short ones.
group.min.session.timeout.ms=1000
# Consumer-protocol (KIP-848) groups: a 1 s heartbeat and a 6 s session, so
# that their tests see a change within seconds (defaults: 5 s and 45 s).
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=6000
group.consumer.min.session.timeout.ms=6000$SECURITY
EOF
	write_log4j
	echo "127.0.0.1:$broker_port" >"$STATE_DIR/bootstrap"
	local cluster_id
	cluster_id=$(new_cluster_id)
	# shellcheck disable=SC2046,SC2086 # the flag is two words; options, split on spaces
	"$JAVA" ${EOSKIT_KAFKA_JVM_OPTS:-} -cp "$LIB_DIR/*" -Dlog4j2.configurationFile="$STATE_DIR/log4j2.properties" \
		kafka.tools.StorageTool format -t "$cluster_id" -c "$STATE_DIR/server.properties" \
		--standalone $(format_features) ${SCRAM[@]+"${SCRAM[@]}"} >"$STATE_DIR/logs/format.log" 2>&1 ||
		{ cat "$STATE_DIR/logs/format.log" >&2; rm -f "$STATE_DIR/server.properties"; die "storage format failed"; }
	rm -f "$STATE_DIR/scram.args"
	echo "$KAFKA_VERSION" >"$STATE_DIR/version"
}

# check_folder refuses a state folder made for another release or another
# security mode than asked for: reusing it would run a broker other than
# the one the caller proves things on.
check_folder() {
	if [ -f "$STATE_DIR/version" ] && [ "$(cat "$STATE_DIR/version")" != "$KAFKA_VERSION" ]; then
		die "$STATE_DIR holds Apache Kafka $(cat "$STATE_DIR/version"), not $KAFKA_VERSION: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_SASL:-}" = 1 ] && [ -f "$STATE_DIR/server.properties" ] && [ ! -f "$STATE_DIR/admin.sasl" ]; then
		die "$STATE_DIR holds a broker without SASL: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_TLS:-}" = 1 ] && [ -f "$STATE_DIR/server.properties" ] && [ ! -f "$STATE_DIR/tls/ca.pem" ]; then
		die "$STATE_DIR holds a broker without TLS: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_TLS:-}" = 1 ] && [ -f "$STATE_DIR/server.properties" ] && [ ! -f "$STATE_DIR/bootstrap-mtls" ]; then
		die "$STATE_DIR holds a TLS broker made before its mutual-TLS listener: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_TLS:-}" = 1 ] && [ -f "$STATE_DIR/server.properties" ] && [ ! -f "$STATE_DIR/tls/jwks.json" ]; then
		die "$STATE_DIR holds a TLS broker made before its OAUTHBEARER key set: clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_TLS:-}" != 1 ] && [ -f "$STATE_DIR/tls/ca.pem" ]; then
		die "$STATE_DIR holds a broker with TLS (EOSKIT_KAFKA_TLS=1): clean it, or use another EOSKIT_STATE_DIR"
	fi
	if [ "${EOSKIT_KAFKA_SASL:-}" != 1 ] && [ -f "$STATE_DIR/admin.sasl" ]; then
		die "$STATE_DIR holds a broker with SASL (EOSKIT_KAFKA_SASL=1): clean it, or use another EOSKIT_STATE_DIR"
	fi
	return 0
}

start() {
	check_folder
	if pid=$(running_pid); then
		log "reusing running broker (pid $pid)"
		echo "KAFKA_BROKERS=$(bootstrap)"
		return 0
	fi
	command -v "$JAVA" >/dev/null || die "java not found: install a JDK 17+ or set JAVA_HOME"
	fetch_jars
	configure
	# Build the readiness helper before the broker starts so that its compile
	# time is not counted against the broker's start-up wait.
	(cd "$ROOT" && go build -o "$STATE_DIR/eosdev" ./tools/eosdev)
	log "starting broker on $(bootstrap) (log: $STATE_DIR/logs/server.log)"
	launch_broker 512m
	local sasl=()
	[ -f "$STATE_DIR/admin.sasl" ] && sasl=(-sasl-file "$STATE_DIR/admin.sasl")
	[ -f "$STATE_DIR/tls/ca.pem" ] && sasl+=(-tls-ca "$STATE_DIR/tls/ca.pem")
	if ! "$STATE_DIR/eosdev" wait-kafka -brokers "$(bootstrap)" -timeout 120s ${sasl[@]+"${sasl[@]}"}; then
		tail -n 40 "$STATE_DIR/logs/server.log" "$STATE_DIR/logs/stdout.log" >&2 || true
		stop_with KILL
		die "broker did not become ready"
	fi
	log "broker (Apache Kafka $KAFKA_VERSION) ready at $(bootstrap)"
	echo "KAFKA_BROKERS=$(bootstrap)"
}

# watch_owner OWNER BROKER starts a detached watchdog that stops BROKER
# (SIGTERM, SIGKILL 30 s later) once OWNER is gone: a test binary killed by
# its timeout, a panic or a signal runs no cleanup, and its private broker
# must not outlive it. The watchdog ends with the broker.
# Each pid is known by its start time too (field 22 of /proc/PID/stat), so
# that a pid reused by another process is never taken for it.
watch_owner() {
	local owner=$1 broker=$2
	setsid bash -c '
		owner=$1 broker=$2
		started() { cut -d" " -f22 "/proc/$1/stat" 2>/dev/null; }
		owner_start=$(started "$owner") broker_start=$(started "$broker")
		alive() { [ -n "$2" ] && [ "$(started "$1")" = "$2" ]; }
		while alive "$owner" "$owner_start" && alive "$broker" "$broker_start"; do sleep 1; done
		alive "$broker" "$broker_start" || exit 0
		kill -TERM "$broker" 2>/dev/null
		for _ in $(seq 1 300); do alive "$broker" "$broker_start" || exit 0; sleep 0.1; done
		alive "$broker" "$broker_start" && kill -KILL "$broker" 2>/dev/null
	' eoskit-broker-watchdog "$owner" "$broker" </dev/null >/dev/null 2>&1 &
}

# stop_with TERM|KILL sends the signal and waits for the process to be gone.
stop_with() {
	local sig=$1 pid
	if ! pid=$(running_pid); then
		rm -f "$PID_FILE"
		return 0
	fi
	kill -s "$sig" "$pid" 2>/dev/null || true
	for _ in $(seq 1 600); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$PID_FILE"; return 0; }
		sleep 0.1
	done
	log "broker (pid $pid) ignored SIG$sig for 60 s; killing it"
	kill -s KILL "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	rm -f "$PID_FILE"
}

# Sourced (by kafka-cluster.sh) for its functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
start) start ;;
stop) stop_with TERM ;;
kill) stop_with KILL ;;
restart)
	if [ "${2:-}" = "--hard" ]; then stop_with KILL; else stop_with TERM; fi
	start
	;;
status)
	pid=$(running_pid) || { echo "not running"; exit 1; }
	echo "running (pid $pid) at $(bootstrap)"
	;;
env)
	running_pid >/dev/null || die "not running"
	echo "KAFKA_BROKERS=$(bootstrap)"
	;;
clean)
	stop_with TERM
	rm -rf "$STATE_DIR"
	;;
*)
	sed -n '2,27p' "$0" >&2
	exit 2
	;;
esac
