#!/usr/bin/env bash
# Build kvchaos/reference:latest (compose/Dockerfile) and kvchaos/toxiproxy (compose/toxiproxy.Dockerfile)
# with no registry and no package index:
# a Docker engine (scripts/docker-setup.sh), the offline base image and wheelhouse
# (scripts/offline-base-image.sh), then the image from the current source. Layers keyed on the
# constraint and requirement files are cached, so a code-only change rebuilds in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/docker-setup.sh
bash scripts/offline-base-image.sh
.venv/bin/python - <<'PY'
from pathlib import Path
from chaos.stack.compose import build_image
print(build_image("kvchaos/reference:latest", Path("."), "compose/Dockerfile",
                  buildargs={"BASE_IMAGE": "kvchaos/base:bookworm"}, wheelhouse=Path("compose/wheelhouse")))
PY
# The real Toxiproxy's image (kvchaos/toxiproxy:<version>, FROM scratch) from its static binary
# ($KVCHAOS_TOXIPROXY_BIN or toxiproxy-server on PATH; the Makefile finds ../shared/tools/...),
# copied into a temporary build context: no registry, nothing committed. Skipped without one.
if [ -n "${KVCHAOS_TOXIPROXY_BIN:-}" ] || command -v toxiproxy-server >/dev/null 2>&1; then
  .venv/bin/python -c 'from chaos.stack.compose import build_toxiproxy_image; print(build_toxiproxy_image())'
else
  echo "build-image: no toxiproxy-server binary (KVCHAOS_TOXIPROXY_BIN): kvchaos/toxiproxy not built"
fi
