#!/usr/bin/env bash
# Builds and runs the Kafka Streams bench peer (scripts/streams/CountByKey.java:
# groupByKey().count() under exactly_once_v2), which tools/bench's
# state part measures eoskit against. Kafka Streams is a bench peer only,
# never a dependency of eoskit; nothing built here is checked in.
#
#   scripts/streams.sh build        resolve kafka-streams from Maven Central and compile the peer (once)
#   scripts/streams.sh run ARGS     build if needed, then run the peer in the foreground
#                                   (exec: a SIGTERM reaches the JVM, which closes Streams and exits 0);
#                                   ARGS are CountByKey's, see its usage
#   scripts/streams.sh classpath    print the peer's classpath
#
# Environment:
#   EOSKIT_CACHE_DIR  where the jars and classes are kept (default ~/.cache/eoskit),
#                     in streams-<version>/ beside the broker's kafka-<version>/
#   JAVA_HOME         the JDK to build and run with (Java 17+); default: java and javac on PATH
#   EOSKIT_STREAMS_HEAP  the JVM's heap (default 512m)
set -euo pipefail

KAFKA_VERSION=4.4.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${EOSKIT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eoskit}
BASE=$CACHE_DIR/streams-$KAFKA_VERSION
LIB_DIR=$BASE/lib
SRC=$ROOT/scripts/streams/CountByKey.java
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java
JAVAC=${JAVA_HOME:+$JAVA_HOME/bin/}javac

log() { echo "streams.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=maven-jars.sh
. "$ROOT/scripts/maven-jars.sh"

# fetch_jars downloads Kafka Streams' runtime classpath once.
fetch_jars() {
	maven_jars "$ROOT/scripts/streams/pom.xml" "$LIB_DIR" "org.apache.kafka:kafka-streams:$KAFKA_VERSION" -Dkafka.version="$KAFKA_VERSION"
}

# classes_dir is where this version of the source compiles to: a changed
# CountByKey.java gets a folder of its own.
classes_dir() { echo "$BASE/classes-$(sha256sum "$SRC" | cut -c1-16)"; }

build() {
	fetch_jars
	local out
	out=$(classes_dir)
	[ -f "$out/.complete" ] && return 0
	command -v "$JAVAC" >/dev/null || die "javac not found: install a JDK 17+ or set JAVA_HOME"
	log "compiling $SRC into $out"
	rm -rf "$out"
	mkdir -p "$out"
	# javac warns of sun.misc.Signal (the peer's SIGTERM handler) whatever
	# the flags: its output is shown only when it fails.
	local msgs
	msgs=$("$JAVAC" --release 17 -cp "$LIB_DIR/*" -d "$out" "$SRC" 2>&1) ||
		{ echo "$msgs" >&2; rm -rf "$out"; die "javac failed"; }
	touch "$out/.complete"
}

classpath() { echo "$(classes_dir):$LIB_DIR/*"; }

case "${1:-}" in
build) build ;;
classpath) build; classpath ;;
run)
	shift
	build
	exec "$JAVA" -Xms"${EOSKIT_STREAMS_HEAP:-512m}" -Xmx"${EOSKIT_STREAMS_HEAP:-512m}" -XX:+UseG1GC \
		-Djava.awt.headless=true -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
		-Dorg.slf4j.simpleLogger.logFile=System.err \
		-cp "$(classpath)" CountByKey "$@"
	;;
*) die "usage: $0 build | run ARGS | classpath" ;;
esac
