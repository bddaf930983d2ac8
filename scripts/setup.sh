#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: system packages, .venv, kvchaos[reference,test].
# Safe to run again; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: missing ${need_apt[*]}; install them (apt-get install ${need_apt[*]}) and rerun" >&2
    exit 3
  fi
fi
# Debian starts redis-server as a service on install; kvchaos runs its own on free ports.

stamp="$VENV/.kvchaos-setup"
want=$(cat pyproject.toml constraints/reference.txt requirements/lmcache-runtime.txt | sha1sum | cut -c1-12)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/kvchaos" ]; then
  echo "setup: $VENV is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
export PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }$PWD/constraints/reference.txt"
# torch first, pinned to the CPU build, so nothing later pulls a CUDA build.
"${pip[@]}" torch==2.13.0
"${pip[@]}" -r requirements/lmcache-runtime.txt
"${pip[@]}" --no-deps lmcache==0.5.6
"${pip[@]}" -e '.[reference,test]'
echo "$want" > "$stamp"
echo "setup: done ($VENV)"
