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
# (EOSKIT_DOCKER_NETWORK=host), never on Docker's 172.17.0.0/16 bridge. The
# engine keeps its default bridge all the same: without one, testcontainers
# creates a bridge network of its own and attaches every container to it.
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

answers() { docker info >/dev/null 2>&1; }

ensure_installed() {
	command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
	[ "$(id -u)" = 0 ] || die "Docker is not installed; run: sudo apt-get install -y docker.io"
	log "installing Debian's docker.io package"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >&2
}

ours() {
	[ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null
}

start() {
	if answers; then
		ours && echo DOCKER_STARTED=yes || echo DOCKER_STARTED=no
		return 0
	fi
	ensure_installed
	[ "$(id -u)" = 0 ] || die "no Docker engine answers and only root can start dockerd here; start Docker and run again"
	mkdir -p "$STATE_DIR"
	log "starting dockerd (log: $STATE_DIR/dockerd.log)"
	# setsid: a Ctrl-C on make must not reach the engine; stop() ends it.
	setsid dockerd --pidfile "$PID_FILE.dockerd" \
		>"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
	echo $! >"$PID_FILE"
	local i
	for i in $(seq 1 120); do
		answers && { echo DOCKER_STARTED=yes; return 0; }
		kill -0 "$(cat "$PID_FILE")" 2>/dev/null || break
		sleep 0.5
	done
	tail -n 20 "$STATE_DIR/dockerd.log" >&2 || true
	die "dockerd did not answer within 60 s"
}

stop() {
	ours || { log "no dockerd of this script's is running"; return 0; }
	local pid i
	pid=$(cat "$PID_FILE")
	kill -TERM "$pid"
	for i in $(seq 1 120); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$PID_FILE"; return 0; }
		sleep 0.5
	done
	log "dockerd (pid $pid) did not stop within 60 s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$PID_FILE"
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
