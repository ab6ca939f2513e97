#!/usr/bin/env bash
# Starts the machine's PostgreSQL (Debian's postgresql package, installed with
# apt-get if missing) for eoskit's tests, and creates the test role and database.
#
#   scripts/postgres.sh start     start (or reuse a running cluster); prints DATABASE_URL=...
#   scripts/postgres.sh stop      stop the cluster, only if this script started it
#   scripts/postgres.sh restart   restart the cluster (fault tests use this)
#   scripts/postgres.sh status    exit 0 if the cluster is running
#   scripts/postgres.sh env       print DATABASE_URL=... for a running cluster
#   scripts/postgres.sh drop-role [--if-idle]  drop the test role and its databases,
#                                 if this state directory's start created it (the
#                                 cluster left running: scripts/with-services.sh,
#                                 after a start that found the cluster up and made
#                                 the role); --if-idle: not while a session uses it
#   scripts/postgres.sh private-start PORT [--tls]   a test's own server (initdb in a
#                                 temporary folder; wal_level=logical), recorded in
#                                 EOSKIT_STATE_DIR; prints DATABASE_URL=...; with
#                                 --tls it takes TCP connections over TLS only, with a
#                                 certificate for 127.0.0.1 and localhost signed by a
#                                 CA of its own (the URL's sslrootcert; sslmode=verify-full)
#   scripts/postgres.sh private-restart [--hard]   restart it (--hard: immediate
#                                 shutdown, which is a crash to the server)
#   scripts/postgres.sh private-stop           stop it and delete its data
#   scripts/postgres.sh private-snapshot NAME  copy its data folder after a
#                                              clean shutdown, and start it again
#   scripts/postgres.sh private-restore NAME   kill it, put that copy back, start
#
# The shared cluster gets wal_level=logical (the outbox relay decodes the log);
# if it had another level, start sets it and restarts the cluster once.
# The test role is a superuser because the tests create and drop one database
# each and create roles with REPLICATION, which only a superuser may. Its
# password is random, made at its creation and kept in $STATE_DIR/password
# (mode 0600), never a well-known one; stop drops the role and what it owns
# (the test databases) if this script, with this state directory, created
# it, whoever started the cluster. A role of that name it did not create is
# used with EOSKIT_PG_PASSWORD and never dropped; without that password,
# start makes this state directory a role of its own (eoskit_ and 8 random
# hex digits, with a database of its name) and leaves the other alone: a
# second checkout, or a machine where a run ended before its stop. The
# private server asks for a password (scram-sha-256) on every
# connection, its own random one. Never point this at a cluster holding
# data you care about.
#
# Environment:
#   EOSKIT_STATE_DIR  where the "started by us" markers live (default <repo>/.eoskit)
#   EOSKIT_PG_USER    the role (default eoskit, or the one start made for this
#                     state directory when eoskit was another's)
#   EOSKIT_PG_DB      the database (default: the role's name)
#   EOSKIT_PG_PASSWORD  the role's password, for a role this script did not
#                     create (default: a random one, made with the role)
#   EOSKIT_OWNER_PID  with private-start, a watchdog stops the private server
#                     once that process is gone, however it ended
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE_DIR=${EOSKIT_STATE_DIR:-$ROOT/.eoskit}/postgres
PG_USER=${EOSKIT_PG_USER:-eoskit}
# The role start created for this state directory, whatever its name
# (unless the role, or its password, is given).
if [ -z "${EOSKIT_PG_USER:-}" ] && [ -z "${EOSKIT_PG_PASSWORD:-}" ] && [ -s "$STATE_DIR/role-created-by-eoskit" ]; then
	PG_USER=$(cat "$STATE_DIR/role-created-by-eoskit")
fi
PG_DB=${EOSKIT_PG_DB:-$PG_USER}
# Names go into SQL and shell commands unquoted: plain identifiers only.
for name in "$PG_USER" "$PG_DB"; do
	[[ $name =~ ^[a-z_][a-z0-9_]{0,62}$ ]] || { echo "postgres.sh: '$name' is not a plain lower-case identifier (EOSKIT_PG_USER, EOSKIT_PG_DB, or $STATE_DIR/role-created-by-eoskit)" >&2; exit 1; }
done

log() { echo "postgres.sh: $*" >&2; }
die() { log "$*"; exit 1; }

ensure_installed() {
	command -v pg_ctlcluster >/dev/null && return 0
	[ "$(id -u)" = 0 ] || die "PostgreSQL is not installed; run: sudo apt-get install -y postgresql"
	log "installing Debian's postgresql package"
	apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq postgresql >&2
}

# cluster prints "VERSION NAME PORT STATUS" of the first cluster pg_lsclusters knows.
cluster() {
	pg_lsclusters -h | awk 'NR==1 {print $1, $2, $3, $4}'
}

as_postgres() {
	if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else sudo -u postgres sh -c "$*"; fi
}

# random prints a password of 32 hex digits.
random() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# password prints the test role's password: EOSKIT_PG_PASSWORD, or the one
# kept in $STATE_DIR/password.
password() {
	if [ -n "${EOSKIT_PG_PASSWORD:-}" ]; then
		echo "$EOSKIT_PG_PASSWORD"
	elif [ -f "$STATE_DIR/password" ]; then
		cat "$STATE_DIR/password"
	else
		die "no password for role $PG_USER: run scripts/postgres.sh start, or set EOSKIT_PG_PASSWORD"
	fi
}

url() {
	local port
	read -r _ _ port _ <<<"$(cluster)"
	echo "DATABASE_URL=postgres://$PG_USER:$(password)@127.0.0.1:$port/$PG_DB?sslmode=disable"
}

# owns_role reports whether this state directory's marker names $PG_USER:
# the role this script created for it.
owns_role() {
	[ -f "$STATE_DIR/role-created-by-eoskit" ] && [ "$(cat "$STATE_DIR/role-created-by-eoskit")" = "$PG_USER" ]
}

# ensure_role creates the test role and its database. A role this script
# created (its marker in $STATE_DIR) keeps its kept password, or gets a new
# one if that was lost. A role it finds and did not create is used with
# EOSKIT_PG_PASSWORD, left as it is and never dropped; without it, only the
# test role of an earlier version of this script, which still has that
# version's well-known password, is taken over (a new password, and the
# marker); for any other, this state directory gets a role of its own
# (unless EOSKIT_PG_USER named the role: then it is refused).
ensure_role() {
	local port=$1 exists pw
	exists=$(as_postgres "psql -XAtq -p $port -d postgres -c \"SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'\"")
	if [ "$exists" = 1 ] && ! owns_role; then
		if [ -n "${EOSKIT_PG_PASSWORD:-}" ]; then
			ensure_database "$port"
			return
		fi
		if PGPASSWORD=eoskit PGCONNECT_TIMEOUT=5 psql -XAtq -h 127.0.0.1 -p "$port" -U "$PG_USER" -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
			log "taking over role $PG_USER, made by an earlier version of this script with a well-known password: it gets a new one"
		elif [ -z "${EOSKIT_PG_USER:-}" ]; then
			local other=$PG_USER
			PG_USER=eoskit_$(random | cut -c1-8)
			[ -n "${EOSKIT_PG_DB:-}" ] || PG_DB=$PG_USER
			log "role $other exists and this checkout's $STATE_DIR did not create it (another checkout did, or a run that never reached its stop): it stays as it is, and this state directory gets a role of its own, $PG_USER"
			exists=
		else
			die "role $PG_USER exists and this checkout's $STATE_DIR did not create it (another checkout did, or someone by hand): set EOSKIT_PG_PASSWORD to its password (another checkout keeps it in its .eoskit/postgres/password), or EOSKIT_STATE_DIR to that checkout's .eoskit, or drop the role"
		fi
		rm -f "$STATE_DIR/password"
	fi
	if [ -z "${EOSKIT_PG_PASSWORD:-}" ] && { [ "$exists" != 1 ] || [ ! -f "$STATE_DIR/password" ]; }; then
		(umask 077 && random >"$STATE_DIR/password")
	fi
	# A role this start makes: scripts/with-services.sh drops it when
	# done (drop-role), even where it did not start the cluster.
	[ "$exists" = 1 ] || echo "$PG_USER" >"$STATE_DIR/role-made-by-last-start"
	[ -f "$STATE_DIR/password" ] && chmod 600 "$STATE_DIR/password"
	echo "$PG_USER" >"$STATE_DIR/role-created-by-eoskit"
	pw=$(password)
	# Not logged by log_statement, whatever the server's setting.
	as_postgres "psql -q -p $port -v ON_ERROR_STOP=1 -d postgres" <<SQL
SET log_statement = 'none';
SELECT 'CREATE ROLE $PG_USER LOGIN SUPERUSER'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') \gexec
ALTER ROLE $PG_USER PASSWORD '${pw//\'/\'\'}';
SQL
	ensure_database "$port"
}

ensure_database() {
	as_postgres "psql -q -p $1 -v ON_ERROR_STOP=1 -d postgres" <<SQL
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_USER'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB') \gexec
SQL
}

# drop_role drops the test role, the databases it owns and what it owns in
# the others, if this state directory's script created it and the cluster
# runs.
drop_role() {
	owns_role || return 0
	local port status db
	read -r _ _ port status <<<"$(cluster)"
	[ "${status:-}" = online ] || { log "cluster is down: role $PG_USER stays"; return 0; }
	if [ "${1:-}" = --if-idle ] && [ -n "$(as_postgres "psql -XAtq -p $port -d postgres -c \"SELECT 1 FROM pg_stat_activity WHERE usename = '$PG_USER' LIMIT 1\"")" ]; then
		log "role $PG_USER has sessions (another run, or make services): it stays"
		return 0
	fi
	as_postgres "psql -XAtq -p $port -d postgres -c \"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '$PG_USER'\"" >/dev/null
	while IFS= read -r db; do
		[ -z "$db" ] || as_postgres "psql -Xq -p $port -v ON_ERROR_STOP=1 -d postgres -c 'DROP DATABASE \"$db\" WITH (FORCE)'" || return 1
	done < <(as_postgres "psql -XAtq -p $port -d postgres -c \"SELECT d.datname FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE r.rolname = '$PG_USER'\"")
	# What it owns in the databases left (a database's slots went with
	# it), then the role.
	while IFS= read -r db; do
		[ -z "$db" ] || as_postgres "psql -Xq -p $port -v ON_ERROR_STOP=1 -d \"$db\" -c 'DROP OWNED BY $PG_USER CASCADE'" || return 1
	done < <(as_postgres "psql -XAtq -p $port -d postgres -c 'SELECT datname FROM pg_database WHERE datallowconn'")
	as_postgres "psql -Xq -p $port -v ON_ERROR_STOP=1 -d postgres -c 'DROP ROLE $PG_USER'" || return 1
	log "dropped role $PG_USER and its databases"
	rm -f "$STATE_DIR/role-created-by-eoskit" "$STATE_DIR/password"
}

start() {
	ensure_installed
	local version name port status
	read -r version name port status <<<"$(cluster)"
	[ -n "${version:-}" ] || die "no PostgreSQL cluster exists; create one with: pg_createcluster --start 15 main"
	mkdir -p "$STATE_DIR"
	local ours=no
	if [ "$status" = online ]; then
		log "reusing running cluster $version/$name on port $port"
	else
		log "starting cluster $version/$name on port $port"
		pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start
		echo "$version $name" >"$STATE_DIR/started-by-eoskit"
	fi
	# Ours only if the marker names this very cluster.
	[ -f "$STATE_DIR/started-by-eoskit" ] && [ "$(cat "$STATE_DIR/started-by-eoskit")" = "$version $name" ] && ours=yes
	for _ in $(seq 1 100); do
		as_postgres "pg_isready -q -h 127.0.0.1 -p $port" && break
		sleep 0.1
	done
	ensure_logical "$version" "$name" "$port" "$ours"
	ensure_role "$port"
	if [ "$ours" = yes ] && [ "${EOSKIT_KEEP_SLOTS:-}" != 1 ]; then
		# Slots left by test or bench runs that were killed keep the
		# server's log: drop those of test databases (eoskit_test...)
		# and of the bench whose databases' sessions are gone.
		as_postgres "psql -q -p $port -v ON_ERROR_STOP=1 -d postgres" <<'SQL'
SELECT pg_drop_replication_slot(s.slot_name) FROM pg_replication_slots s
WHERE NOT s.active
  AND (s.slot_name LIKE 'eoskit\_outbox\_eoskit\_test%' OR s.slot_name LIKE 'bench\_%')
  AND NOT EXISTS (SELECT FROM pg_stat_activity a JOIN pg_database d ON d.datname = a.datname WHERE d.oid = s.datoid);
SQL
	fi
	url
}

# ensure_logical sets what the outbox relay needs (logical decoding, room
# for the slots and replication connections of parallel tests) and
# restarts the cluster if wal_level had to change. ALTER SYSTEM writes
# postgresql.auto.conf, which works for any cluster layout.
ensure_logical() {
	local version=$1 name=$2 port=$3 ours=$4 level
	level=$(as_postgres "psql -XAtq -p $port -d postgres -c 'SHOW wal_level'")
	[ "$level" = logical ] && return 0
	# A cluster someone else started may serve others: it is theirs to
	# restart.
	[ "$ours" = yes ] || die "cluster $version/$name runs with wal_level=$level and was not started by eoskit: set wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart it, or stop it and run this again"
	log "setting wal_level=logical (was $level) and restarting cluster $version/$name"
	as_postgres "psql -Xq -p $port -v ON_ERROR_STOP=1 -d postgres" <<SQL
ALTER SYSTEM SET wal_level = logical;
ALTER SYSTEM SET max_replication_slots = 64;
ALTER SYSTEM SET max_wal_senders = 64;
SQL
	pg_ctlcluster --skip-systemctl-redirect "$version" "$name" restart -m fast
	for _ in $(seq 1 100); do
		as_postgres "pg_isready -q -h 127.0.0.1 -p $port" && break
		sleep 0.1
	done
	level=$(as_postgres "psql -XAtq -p $port -d postgres -c 'SHOW wal_level'")
	[ "$level" = logical ] || die "wal_level is still $level after a restart"
}

# The private server: its data folder is made under /tmp (the postgres
# user must reach it) and its path kept in $STATE_DIR/pgdata.
private_bin() { ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1; }

private_data() {
	[ -f "$STATE_DIR/pgdata" ] || die "no private server in $STATE_DIR"
	cat "$STATE_DIR/pgdata"
}

# private_tls readies TLS for the private server in DATA (private-start
# --tls): a CA of its own (DATA/tls/ca.pem, which clients trust), a server
# certificate for 127.0.0.1 and localhost signed by it, ssl = on, and
# pg_hba.conf accepting TCP connections, replication included, over TLS
# only (hostssl), each with its password.
private_tls() {
	local data=$1 tls=$1/tls
	command -v openssl >/dev/null || die "openssl not found: the TLS server's certificates are made with it (apt-get install openssl)"
	as_postgres "umask 077 && mkdir -p $tls && cd $tls &&
		openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 -subj '/CN=eoskit test CA' &&
		openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj '/CN=localhost' &&
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext &&
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.crt -days 3650 -extfile san.ext &&
		chmod 755 $tls && chmod 644 ca.pem" >"$STATE_DIR/openssl.log" 2>&1 ||
		die "openssl failed making the private server's certificates: $(tail -5 "$STATE_DIR/openssl.log")"
	as_postgres "cat >>$data/db/postgresql.auto.conf" <<CONF
ssl = on
ssl_cert_file = '$tls/server.crt'
ssl_key_file = '$tls/server.key'
CONF
	as_postgres "cat >$data/db/pg_hba.conf" <<HBA
local     all          all                 scram-sha-256
hostssl   all          all   127.0.0.1/32  scram-sha-256
hostssl   replication  all   127.0.0.1/32  scram-sha-256
HBA
}

private_start() {
	local port=$1 tls=${2:-} bin data pw params=sslmode=disable
	[[ $port =~ ^[0-9]+$ ]] || die "private-start needs a port"
	[ -z "$tls" ] || [ "$tls" = --tls ] || die "private-start PORT [--tls]"
	ensure_installed
	bin=$(private_bin)
	mkdir -p "$STATE_DIR"
	# Made by the postgres user, who must own it, as root or not.
	data=$(as_postgres "mktemp -d /tmp/eoskit-pg.XXXXXX")
	as_postgres "chmod 755 $data"
	echo "$data" >"$STATE_DIR/pgdata"
	# A password on every connection: the server is any local user's to
	# reach. The file goes once initdb has read it.
	pw=$(random)
	as_postgres "umask 077 && cat >$data/pw" <<<"$pw"
	as_postgres "$bin/initdb -D $data/db -U $PG_USER --auth=scram-sha-256 --pwfile=$data/pw -E UTF8 --no-sync" >/dev/null
	as_postgres "rm -f $data/pw"
	# Written by the postgres user: the data folder is its alone.
	as_postgres "cat >>$data/db/postgresql.auto.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$data'
wal_level = logical
max_replication_slots = 16
max_wal_senders = 16
fsync = off
CONF
	if [ -n "$tls" ]; then
		private_tls "$data"
		params="sslmode=verify-full&sslrootcert=$data/tls/ca.pem"
	fi
	as_postgres "$bin/pg_ctl -D $data/db -l $data/log -w -t 60 start" >/dev/null ||
		die "private server did not start: $(as_postgres "tail -5 $data/log")"
	if [ -n "${EOSKIT_OWNER_PID:-}" ]; then
		# A watchdog: once the owner is gone, stop the server and delete
		# its data. setsid and closed descriptors: the caller's pipes must
		# not wait on it.
		setsid bash -c "$(declare -f as_postgres)
			while kill -0 $EOSKIT_OWNER_PID 2>/dev/null && [ -d $data/db ]; do sleep 1; done
			if [ -d $data/db ]; then as_postgres '$bin/pg_ctl -D $data/db -m immediate stop'; as_postgres 'rm -rf $data'; fi" \
			</dev/null >/dev/null 2>&1 &
	fi
	echo "DATABASE_URL=postgres://$PG_USER:$pw@127.0.0.1:$port/postgres?$params"
}

private_restart() {
	local data mode=fast
	data=$(private_data)
	[ "${1:-}" = --hard ] && mode=immediate
	as_postgres "$(private_bin)/pg_ctl -D $data/db -l $data/log -m $mode -w -t 60 restart" >/dev/null ||
		die "private server did not restart: $(as_postgres "tail -5 $data/log")"
}

# A cold copy of the private server's data folder, taken after a clean
# shutdown (what a volume snapshot or a base backup restores), and its
# restore: the server is killed, its data replaced by the copy, and
# started again, replication slots and all.
private_snapshot() {
	local data name=$1 bin
	[[ $name =~ ^[a-z0-9]+$ ]] || die "private-snapshot needs a name of [a-z0-9]"
	data=$(private_data)
	bin=$(private_bin)
	as_postgres "$bin/pg_ctl -D $data/db -m fast -w -t 60 stop" >/dev/null
	as_postgres "rm -rf $data/snap-$name && cp -a $data/db $data/snap-$name"
	as_postgres "$bin/pg_ctl -D $data/db -l $data/log -w -t 60 start" >/dev/null ||
		die "private server did not start: $(as_postgres "tail -5 $data/log")"
}

private_restore() {
	local data name=$1 bin
	[[ $name =~ ^[a-z0-9]+$ ]] || die "private-restore needs a name of [a-z0-9]"
	data=$(private_data)
	bin=$(private_bin)
	as_postgres "[ -d $data/snap-$name ]" || die "no snapshot $name"
	as_postgres "$bin/pg_ctl -D $data/db -m immediate -w stop" >/dev/null 2>&1 || true
	# Never replace the files of a server still running.
	if as_postgres "$bin/pg_ctl -D $data/db status" >/dev/null 2>&1; then
		die "private server did not stop; not restoring over it"
	fi
	as_postgres "rm -rf $data/db && cp -a $data/snap-$name $data/db"
	as_postgres "$bin/pg_ctl -D $data/db -l $data/log -w -t 60 start" >/dev/null ||
		die "private server did not start: $(as_postgres "tail -5 $data/log")"
}

private_stop() {
	[ -f "$STATE_DIR/pgdata" ] || return 0
	local data
	data=$(private_data)
	[ -d "$data/db" ] && as_postgres "$(private_bin)/pg_ctl -D $data/db -m immediate -w stop" >/dev/null 2>&1 || true
	as_postgres "rm -rf $data" || rm -rf "$data"
	rm -f "$STATE_DIR/pgdata"
}

stop() {
	if command -v pg_lsclusters >/dev/null; then
		drop_role || log "could not drop role $PG_USER; stopping the cluster all the same"
	fi
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
drop-role) drop_role "${2:-}" ;;
private-start) private_start "${2:-}" "${3:-}" ;;
private-restart) private_restart "${2:-}" ;;
private-stop) private_stop ;;
private-snapshot) private_snapshot "${2:-}" ;;
private-restore) private_restore "${2:-}" ;;
*)
	sed -n '2,30p' "$0" >&2
	exit 2
	;;
esac
