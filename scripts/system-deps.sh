#!/usr/bin/env bash
# Installs the real peers the tests and benchmarks talk to, from Debian's packages:
# nats-server (JetStream peer), redis-server (Redis Streams peer), aria2 and transmission-cli
# (third-party BitTorrent clients), chromium (the console tests' browser), and a C compiler
# with Python's headers for the log's C framer (src/loglake/log/_framing.c). Only what is
# missing is installed.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(gcc)
include=$("${PYTHON:-python3.11}" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$include/Python.h" ] || need+=(python3-dev)
command -v nats-server >/dev/null || need+=(nats-server)
command -v redis-server >/dev/null || need+=(redis-server)
command -v aria2c >/dev/null || need+=(aria2)
command -v transmission-cli >/dev/null || need+=(transmission-cli)
# The console tests drive Debian's chromium with Playwright (never `playwright install`).
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to apt-get install ${need[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "installing test peers: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts redis-server as a service on install; tests start their own on loopback ports.
