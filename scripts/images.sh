#!/usr/bin/env bash
# Builds eoskit's container images locally, with no image registry: a Debian
# root filesystem made by mmdebstrap from Debian's packages (a JRE and
# PostgreSQL), imported into Docker twice with each image's own files:
#
#   eoskit/kafka:VERSION   Apache Kafka from the Maven Central jars of
#                          scripts/kafka.sh, started by images/kafka-run with
#                          the official apache/kafka image's contract
#                          (KAFKA_* variables become server.properties,
#                          CLUSTER_ID, data in KAFKA_LOG_DIRS)
#   eoskit/postgres:15     Debian's PostgreSQL 15, started by
#                          images/postgres-entrypoint.sh with the official
#                          postgres image's contract (POSTGRES_USER,
#                          POSTGRES_PASSWORD, POSTGRES_DB, PGDATA, PGPORT)
#
#   scripts/images.sh build    build what is missing or stale; prints the image names
#   scripts/images.sh names    print the image names
#
# An image is rebuilt only when what it is made of changed: each carries
# EOSKIT_IMAGE_KEY, a hash of this script, the files under images/, the
# Kafka version and the Debian suite and packages. The root filesystem is
# kept in the cache folder under the same kind of key. Needs a Docker engine
# (scripts/docker.sh start) and root, for mmdebstrap.
#
# Environment:
#   EOSKIT_KAFKA_VERSION  the Apache Kafka release (default 4.4.0, as scripts/kafka.sh)
#   EOSKIT_CACHE_DIR      where jars and the root filesystem are kept (default ~/.cache/eoskit)
#   EOSKIT_DEBIAN_MIRROR  default http://deb.debian.org/debian
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=kafka.sh
. "$HERE/kafka.sh" # KAFKA_VERSION, CACHE_DIR, LIB_DIR, fetch_jars

SUITE=bookworm
PG_MAJOR=15
PACKAGES=openjdk-17-jre-headless,postgresql-$PG_MAJOR
MIRROR=${EOSKIT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KAFKA_IMAGE=eoskit/kafka:$KAFKA_VERSION
POSTGRES_IMAGE=eoskit/postgres:$PG_MAJOR

log() { echo "images.sh: $*" >&2; }
die() { log "$*"; exit 1; }

hash_of() { sha256sum | cut -c1-16; }

# The keys: the root filesystem's is what makes it (the function that runs
# mmdebstrap, the suite, packages and mirror); an image's adds this script
# and the files it lays over the root filesystem (for Kafka also the jars'
# pom.xml and version).
rootfs_key() { { declare -f rootfs; echo "$SUITE $PACKAGES $MIRROR"; } | hash_of; }

image_key() { # FILE...
	{ rootfs_key; cat "$HERE/images.sh" "$@"; } | hash_of
}

current() { # IMAGE KEY: exit 0 if IMAGE exists and carries KEY
	timeout 60 docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$1" 2>/dev/null |
		grep -qx "EOSKIT_IMAGE_KEY=$2"
}

# Temporary files of this run, removed however it ends.
TMP=()
cleanup() { [ ${#TMP[@]} -eq 0 ] || rm -rf "${TMP[@]}"; }
trap cleanup EXIT

# rootfs builds (once per key) a tarball of Debian with a JRE and PostgreSQL.
rootfs() {
	local tar=$CACHE_DIR/rootfs-$(rootfs_key).tar
	if [ ! -f "$tar" ]; then
		command -v mmdebstrap >/dev/null || {
			[ "$(id -u)" = 0 ] || die "mmdebstrap is missing; run: sudo apt-get install -y mmdebstrap"
			log "installing Debian's mmdebstrap package"
			timeout 10m apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
			DEBIAN_FRONTEND=noninteractive timeout 10m apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends mmdebstrap >&2
		}
		mkdir -p "$CACHE_DIR"
		log "building a $SUITE root filesystem with $PACKAGES (about a minute)"
		# (This runs inside $(...), whose EXIT trap is not the script's.)
		timeout 20m mmdebstrap --quiet --format=tar --variant=minbase --include="$PACKAGES" \
			--aptopt='APT::Install-Recommends "false"' \
			--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
			"$SUITE" "$tar.partial" "$MIRROR" >&2 || { rm -f "$tar.partial"; die "mmdebstrap failed"; }
		mv "$tar.partial" "$tar"
	fi
	echo "$tar"
}

# import IMAGE KEY OVERLAY CHANGE... imports the root filesystem with the
# files of OVERLAY (a folder laid over /) as IMAGE.
import() {
	local image=$1 key=$2 overlay=$3 base work
	shift 3
	base=$(rootfs)
	work=$(mktemp "$CACHE_DIR/image.XXXXXX.tar")
	TMP+=("$work" "$work.overlay" "$work.base" "$work.add")
	cp "$base" "$work"
	# Append the overlay's files and the folders the base lacks: Docker
	# refuses a tarball that names a path twice. A folder the base has is
	# left out; a file it has is an error (the overlay would not replace it).
	(cd "$overlay" && find . -mindepth 1 | sort) >"$work.overlay"
	tar -tf "$base" | sed 's|/$||' | sort >"$work.base"
	local p
	while IFS= read -r p; do
		[ -d "$overlay/$p" ] || die "the overlay's $p is in the root filesystem already"
	done < <(comm -12 "$work.overlay" "$work.base")
	comm -23 "$work.overlay" "$work.base" >"$work.add"
	tar -rf "$work" --owner=0 --group=0 --no-recursion -C "$overlay" -T "$work.add"
	local changes=(--change "ENV EOSKIT_IMAGE_KEY=$key")
	local c
	for c in "$@"; do changes+=(--change "$c"); done
	timeout 10m docker import "${changes[@]}" "$work" "$image" >/dev/null || die "docker import $image failed"
	log "built $image"
}

build_kafka() {
	local key
	key=$(echo "$KAFKA_VERSION" | image_key "$ROOT/scripts/kafka/pom.xml" "$HERE/images/kafka-run" "$HERE/images/kafka-log4j2.properties" -)
	current "$KAFKA_IMAGE" "$key" && return 0
	fetch_jars
	local overlay
	overlay=$(mktemp -d)
	TMP+=("$overlay")
	mkdir -p "$overlay/opt/kafka/libs" "$overlay/opt/kafka/config" "$overlay/etc/kafka/docker" "$overlay/var/lib/kafka/data"
	cp "$LIB_DIR"/*.jar "$overlay/opt/kafka/libs/"
	install -m 0755 "$HERE/images/kafka-run" "$overlay/etc/kafka/docker/run"
	install -m 0644 "$HERE/images/kafka-log4j2.properties" "$overlay/etc/kafka/docker/log4j2.properties"
	import "$KAFKA_IMAGE" "$key" "$overlay" \
		"ENV KAFKA_VERSION=$KAFKA_VERSION" \
		"ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" \
		'VOLUME ["/var/lib/kafka/data"]' \
		'CMD ["/etc/kafka/docker/run"]'
}

build_postgres() {
	local key
	key=$(image_key "$HERE/images/postgres-entrypoint.sh")
	current "$POSTGRES_IMAGE" "$key" && return 0
	local overlay
	overlay=$(mktemp -d)
	TMP+=("$overlay")
	mkdir -p "$overlay/usr/local/bin"
	install -m 0755 "$HERE/images/postgres-entrypoint.sh" "$overlay/usr/local/bin/docker-entrypoint.sh"
	import "$POSTGRES_IMAGE" "$key" "$overlay" \
		"ENV PATH=/usr/lib/postgresql/$PG_MAJOR/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		'ENV PGDATA=/var/lib/postgresql/data' \
		'ENV LANG=C.UTF-8' \
		'VOLUME ["/var/lib/postgresql/data"]' \
		'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
		'CMD ["postgres"]'
}

names() {
	echo "EOSKIT_KAFKA_IMAGE=$KAFKA_IMAGE"
	echo "EOSKIT_POSTGRES_IMAGE=$POSTGRES_IMAGE"
}

case "${1:-}" in
build)
	timeout 20 docker info >/dev/null 2>&1 || die "no Docker engine answers: run scripts/docker.sh start"
	# One build at a time on this machine (they share the cache folder).
	mkdir -p "$CACHE_DIR"
	exec 9>"$CACHE_DIR/images.lock"
	flock 9
	build_kafka
	build_postgres
	names
	;;
names) names ;;
*)
	sed -n '2,27p' "$0" >&2
	exit 2
	;;
esac
