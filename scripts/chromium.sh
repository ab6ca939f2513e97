#!/usr/bin/env bash
# Makes a Chromium answer on this machine for the dashboard page's browser
# test (patterns/dashboard/web, driven by chromedp): uses one on the PATH
# (chromium, chromium-browser, google-chrome), or installs Debian's
# chromium package (as root). About 15 s with a warm package cache.
#
#   scripts/chromium.sh install   reuse or install; prints the path
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

install() {
	local name
	for name in chromium chromium-browser google-chrome; do
		if command -v "$name" >/dev/null; then
			command -v "$name"
			return 0
		fi
	done
	if [ "$(id -u)" != 0 ]; then
		log "no Chromium, and only root installs one here; run: sudo apt-get install -y chromium"
		exit 1
	fi
	log "installing Debian's chromium package"
	timeout 10m apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
	DEBIAN_FRONTEND=noninteractive timeout 10m apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium >&2
	command -v chromium
}

case "${1:-}" in
install) install ;;
*)
	echo "usage: $0 install" >&2
	exit 2
	;;
esac
