#!/usr/bin/env bash
# Starts the machine's PostgreSQL (Debian's postgresql package, installed with
# apt-get if missing) for eoskit's tests, and creates the test role and database.
#
#   scripts/postgres.sh start     start (or reuse a running cluster); prints DATABASE_URL=...
#   scripts/postgres.sh stop      stop the cluster, only if this script started it
#   scripts/postgres.sh restart   restart the cluster (fault tests use this)
#   scripts/postgres.sh status    exit 0 if the cluster is running
#   scripts/postgres.sh env       print DATABASE_URL=... for a running cluster
#
# The test role is a superuser because the integration harness creates and
# drops one database per test. Never point this at a cluster holding data you
# care about.
#
# Environment:
#   EOSKIT_STATE_DIR  where the "started by us" marker lives (default <repo>/.eoskit)
#   EOSKIT_PG_USER, EOSKIT_PG_PASSWORD, EOSKIT_PG_DB   default eoskit / eoskit / eoskit
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE_DIR=${EOSKIT_STATE_DIR:-$ROOT/.eoskit}/postgres
PG_USER=${EOSKIT_PG_USER:-eoskit}
PG_PASSWORD=${EOSKIT_PG_PASSWORD:-eoskit}
PG_DB=${EOSKIT_PG_DB:-eoskit}

log() { echo "postgres.sh: $*" >&2; }
die() { log "$*"; exit 1; }

ensure_installed() {
	command -v pg_ctlcluster >/dev/null && return 0
	[ "$(id -u)" = 0 ] || die "PostgreSQL is not installed; run: sudo apt-get install -y postgresql"
	log "installing Debian's postgresql package"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
}

# cluster prints "VERSION NAME PORT STATUS" of the first cluster pg_lsclusters knows.
cluster() {
	pg_lsclusters -h | awk 'NR==1 {print $1, $2, $3, $4}'
}

as_postgres() {
	if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else sudo -u postgres sh -c "$*"; fi
}

url() {
	local port
	read -r _ _ port _ <<<"$(cluster)"
	echo "DATABASE_URL=postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$port/$PG_DB?sslmode=disable"
}

start() {
	ensure_installed
	local version name port status
	read -r version name port status <<<"$(cluster)"
	[ -n "${version:-}" ] || die "no PostgreSQL cluster exists; create one with: pg_createcluster --start 15 main"
	mkdir -p "$STATE_DIR"
	if [ "$status" = online ]; then
		log "reusing running cluster $version/$name on port $port"
	else
		log "starting cluster $version/$name on port $port"
		pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start
		echo "$version $name" >"$STATE_DIR/started-by-eoskit"
	fi
	for _ in $(seq 1 100); do
		as_postgres "pg_isready -q -h 127.0.0.1 -p $port" && break
		sleep 0.1
	done
	as_postgres "psql -q -p $port -v ON_ERROR_STOP=1 -d postgres" <<SQL
SELECT 'CREATE ROLE $PG_USER LOGIN SUPERUSER PASSWORD ''$PG_PASSWORD'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') \gexec
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_USER'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB') \gexec
SQL
	url
}

stop() {
	[ -f "$STATE_DIR/started-by-eoskit" ] || { log "cluster was not started by eoskit; leaving it running"; return 0; }
	local version name
	read -r version name <"$STATE_DIR/started-by-eoskit"
	pg_ctlcluster --skip-systemctl-redirect "$version" "$name" stop -m fast || true
	rm -f "$STATE_DIR/started-by-eoskit"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart)
	read -r version name _ _ <<<"$(cluster)"
	pg_ctlcluster --skip-systemctl-redirect "$version" "$name" restart -m fast
	;;
status)
	command -v pg_lsclusters >/dev/null || { echo "not installed"; exit 1; }
	read -r version name port status <<<"$(cluster)"
	[ "${status:-}" = online ] || { echo "not running"; exit 1; }
	echo "running: cluster $version/$name on port $port"
	;;
env) url ;;
*)
	sed -n '2,18p' "$0" >&2
	exit 2
	;;
esac
