#!/bin/bash
# eoskit/postgres's entrypoint (scripts/images.sh builds the image), with the
# official postgres image's contract so that testcontainers-go's postgres
# module drives either image alike:
#
#   - POSTGRES_USER (default postgres), POSTGRES_PASSWORD (required) and
#     POSTGRES_DB (default: the user) are created on the first start, when
#     PGDATA holds no cluster; a restart on the same volume keeps its data;
#   - the first start runs a socket-only server to create them, then the
#     real one, so "database system is ready to accept connections" is
#     logged twice (the module waits for the second);
#   - PGPORT sets the port (default 5432), for a container on the host's
#     network; "postgres ARGS..." runs the server with ARGS;
#   - databases are UTF8 (locale C.UTF-8).
# `docker import` can not set the official image's STOPSIGNAL SIGINT (a
# fast shutdown; docker stop's SIGTERM waits for every client): package integration
# sets it on the containers it starts.
set -euo pipefail

PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA
run_as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "${1:-}" != postgres ]; then
	exec "$@"
fi
shift

mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 0700 "$PGDATA"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}"
	user=${POSTGRES_USER:-postgres}
	db=${POSTGRES_DB:-$user}
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	chown postgres "$pwfile"
	run_as_postgres initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
		--encoding=UTF8 --locale=C.UTF-8 >/dev/null
	rm -f "$pwfile"
	echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
	echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
	run_as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start
	if [ "$db" != postgres ]; then
		run_as_postgres psql -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres \
			-c "CREATE DATABASE \"$db\"" >/dev/null
	fi
	run_as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
	echo "postgres-entrypoint: initialized $PGDATA for $user, database $db"
fi

exec setpriv --reuid=postgres --regid=postgres --init-groups postgres "$@"
