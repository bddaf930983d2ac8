#!/usr/bin/env bash
# Make a Docker engine and a compose CLI available on this (Debian) machine. Idempotent.
#
#   1. apt-get install docker.io docker-compose (and debootstrap, for offline-base-image.sh)
#      when missing;
#   2. start dockerd in the background when `docker info` does not answer (as root; log in
#      $DOCKERD_LOG), then wait up to $DOCKERD_WAIT_S seconds for it.
#
# Exit codes: 0 ready, 3 cannot install (not root / no apt-get) or dockerd did not answer.
set -euo pipefail
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/kvchaos-dockerd.log}
DOCKERD_WAIT_S=${DOCKERD_WAIT_S:-60}

say() { echo "docker-setup: $*"; }
die() { echo "docker-setup: $*" >&2; exit 3; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  need_apt+=(docker-compose)
fi
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing ${need_apt[*]}; install them (apt-get install ${need_apt[*]}) and rerun"
  fi
  say "installing ${need_apt[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
  say "engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || die "no Docker engine answers and only root can start dockerd"
# A service manager (systemd) may own dockerd; else start it ourselves, detached from this shell.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl start docker || true
fi
if ! docker info >/dev/null 2>&1 && ! pgrep -x dockerd >/dev/null 2>&1; then
  say "starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  nohup setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
fi
deadline=$((SECONDS + DOCKERD_WAIT_S))
until docker info >/dev/null 2>&1; do
  if [ $SECONDS -ge $deadline ]; then
    tail -n 20 "$DOCKERD_LOG" >&2 2>/dev/null || true
    die "dockerd did not answer within ${DOCKERD_WAIT_S}s (log: $DOCKERD_LOG)"
  fi
  sleep 1
done
say "engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
