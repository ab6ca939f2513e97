#!/usr/bin/env bash
# Makes a Docker engine answer on this machine for eoskit's containers suite:
# uses the running one, or installs Debian's docker.io (when dockerd is
# missing) and starts dockerd; stops only a dockerd this script started.
#
#   scripts/docker.sh start     reuse or start an engine; prints DOCKER_STARTED=yes|no
#   scripts/docker.sh stop      stop the engine, only if this script started it
#   scripts/docker.sh status    exit 0 if an engine answers
#
# The tests run their containers on the host's network
# (EOSKIT_DOCKER_NETWORK=host), never on Docker's 172.17.0.0/16 bridge. A
# dockerd started here touches no firewall rule and no forwarding setting
# (--iptables=false --ip-forward=false --ip-masq=false); it keeps its
# default bridge interface, docker0 (testcontainers looks for the bridge
# network), and stop() deletes docker0 again if it was not there before.
# Its images stay in /var/lib/docker, so the next run reuses them.
#
# Environment:
#   EOSKIT_STATE_DIR  where dockerd's pid file and log live (default <repo>/.eoskit)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE_DIR=${EOSKIT_STATE_DIR:-$ROOT/.eoskit}/docker
PID_FILE=$STATE_DIR/dockerd.pid

log() { echo "docker.sh: $*" >&2; }
die() { log "$*"; exit 1; }

answers() { timeout 20 docker info >/dev/null 2>&1; }

ensure_installed() {
	command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
	[ "$(id -u)" = 0 ] || die "Docker is not installed; run: sudo apt-get install -y docker.io"
	log "installing Debian's docker.io package"
	timeout 10m apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
	DEBIAN_FRONTEND=noninteractive timeout 10m apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends docker.io >&2
}

# ours: the pid file names a live dockerd (a pid alone may have been
# reused since, after a reboot say).
ours() {
	[ -f "$PID_FILE" ] || return 1
	local pid exe
	pid=$(cat "$PID_FILE")
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	[ "${exe##*/}" = dockerd ]
}

start() {
	if answers; then
		ours && echo DOCKER_STARTED=yes || echo DOCKER_STARTED=no
		return 0
	fi
	ensure_installed
	# Installing the package may have started the system's own engine
	# (systemd): that one is not ours to stop.
	answers && { echo DOCKER_STARTED=no; return 0; }
	[ "$(id -u)" = 0 ] || die "no Docker engine answers and only root can start dockerd here; start Docker and run again"
	mkdir -p "$STATE_DIR"
	rm -f "$STATE_DIR/docker0"
	ip link show docker0 >/dev/null 2>&1 || touch "$STATE_DIR/docker0"
	log "starting dockerd (log: $STATE_DIR/dockerd.log)"
	# setsid: a Ctrl-C on make must not reach the engine; stop() ends it.
	setsid dockerd --pidfile "$PID_FILE.dockerd" --iptables=false --ip-forward=false --ip-masq=false \
		>"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
	echo $! >"$PID_FILE"
	local i
	for i in $(seq 1 120); do
		answers && { echo DOCKER_STARTED=yes; return 0; }
		kill -0 "$(cat "$PID_FILE")" 2>/dev/null || break
		sleep 0.5
	done
	tail -n 20 "$STATE_DIR/dockerd.log" >&2 || true
	stop
	die "dockerd did not answer within 60 s (its log: $STATE_DIR/dockerd.log)"
}

stop() {
	local pid i
	if ! ours; then
		log "no dockerd of this script's is running"
		rm -f "$PID_FILE"
		remove_bridge
		return 0
	fi
	pid=$(cat "$PID_FILE")
	kill -TERM "$pid"
	for i in $(seq 1 120); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "dockerd (pid $pid) did not stop within 60 s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$PID_FILE"
	remove_bridge
}

# remove_bridge deletes docker0 if a dockerd of this script's made it.
remove_bridge() {
	[ -f "$STATE_DIR/docker0" ] || return 0
	ip link del docker0 2>/dev/null || true
	rm -f "$STATE_DIR/docker0"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) answers ;;
*)
	sed -n '2,15p' "$0" >&2
	exit 2
	;;
esac
