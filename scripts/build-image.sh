#!/usr/bin/env bash
# Build kvchaos/reference:latest (compose/Dockerfile) with no registry and no package index:
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
