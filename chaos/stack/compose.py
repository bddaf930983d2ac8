"""ComposeStack: a stack file's services as Docker containers, driven by docker compose.

    stack file ─ load_stack (spec.py: variables, free ports) ─ resolved compose file
        (<run_dir>/compose.resolved.yml: no variables left, kvchaos labels, the run dir bind-mounted,
         telemetry off, explicit health-check timings)
        └─> `docker compose` (v2) or `docker-compose` (v1): `up -d --no-deps` wave by wave, `down`
        └─> Docker engine API (docker SDK): health, kill, stop/start, pause/unpause, logs, sweep

Every run is its own compose project, ``kvchaos-<run id>``; compose labels every container,
network and volume with ``com.docker.compose.project``, and kvchaos adds ``io.kvchaos.run`` to
each container, so :func:`remove_project` finds what a dead runner left. The project is written
to the run's journal (kind ``compose_project``) before anything starts, and ``kvchaos cleanup``
removes only the projects of journals whose runner is gone: never every ``kvchaos-*`` project,
which on a shared host would take down other runs' stacks.

Since every service uses ``network_mode: host`` and the ports come from the same variables, the
addresses in ``settings`` are the same as under LocalStack. Paths under ``${KVCHAOS_RUN_DIR}``
are the same inside and outside the containers: the run dir is bind-mounted at its own path.

Health: a ``kvchaos probe URL`` health check of a host-network service is run by kvchaos from
the host (the same network namespace, so the same URL), as LocalStack does: the image need not
contain kvchaos (the real Toxiproxy image has no shell), and no Python process is spawned in a
container every interval. Such services get ``healthcheck: disable`` in the resolved file; other
health checks (``redis-cli ping``) run in the container and kvchaos reads Docker's health status.
kvchaos orders the start itself (``depends_on`` conditions, proxy links before dependants), so
the resolved file's ``depends_on`` is the plain list form.

Images: a service with ``build:`` gets the image name ``image:`` gives (or
``kvchaos-local/<stack>-<service>:latest``); when that image is missing, :func:`build_image`
builds it from a filtered build context (no ``.git``, ``.venv``, caches: the legacy builder
sends the whole context) with the host's network, ``KVCHAOS_BASE_IMAGE`` as build arg
``BASE_IMAGE`` and the wheels of ``KVCHAOS_WHEELHOUSE`` (default ``compose/wheelhouse`` in the
build context, where scripts/offline-base-image.sh puts them) as build arg ``WHEELHOUSE``.

Filesystem L2 with a size (``x-kvchaos.l2_fs_size``, for the disk_full fault): a tmpfs of that
size is mounted at ``l2_fs_path`` on the host before the containers start, exactly as LocalStack
does, and reaches the containers through the run dir's bind mount; the fault fills it from the
host under both backends.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import psutil
import docker.errors
import yaml
from docker.models.containers import Container
from docker.utils.build import exclude_paths
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from chaos import interrupts
from chaos.journal import Journal
from chaos.stack.base import (ServiceExit, ServiceStatus, Stack, StackError, cleanup_hint, down_after_failed_up,
                              new_run_id)
from chaos.stack.environment import TELEMETRY_OFF
from chaos.stack.interpolate import interpolate_data
from chaos.stack.local import LocalStack, signal_number
from chaos.stack.probe import probe, probe_url_of
from chaos.stack.spec import HealthCheck, StackSpec, load_stack
from chaos.yamlsource import load_yaml

#: Label on every container kvchaos creates: the run id.
LABEL_RUN = "io.kvchaos.run"
#: Label on every container kvchaos creates: the stack file it came from.
LABEL_STACK = "io.kvchaos.stack"
#: Compose's own labels (v1 and v2 both set them).
LABEL_PROJECT = "com.docker.compose.project"
LABEL_SERVICE = "com.docker.compose.service"
#: Every compose project kvchaos starts is named ``kvchaos-...``.
PROJECT_PREFIX = "kvchaos-"
#: Seconds ``kill(..., "SIGKILL")`` waits for the container to stop.
KILL_WAIT_S = 10.0
#: Health deadline (s) for a service without a health check: it only has to be running.
NO_HEALTHCHECK_WAIT_S = 30.0
#: Paths a build context never needs (the legacy builder sends the whole context to dockerd).
BUILD_CONTEXT_EXCLUDES = [".git", ".venv", "venv", "**/__pycache__", "**/*.pyc", "*.egg-info",
                          ".pytest_cache", ".mypy_cache", ".ruff_cache", "reports", "node_modules",
                          "compose/wheelhouse", "compose/wheelhouse-vllm", ".venv-vllm"]
#: Where scripts/offline-base-image.sh puts the wheelhouse, relative to the repository root (the
#: build context of compose/Dockerfile); used when ``KVCHAOS_WHEELHOUSE`` is not set.
DEFAULT_WHEELHOUSE = "compose/wheelhouse"
#: Folder in the build context that receives ``KVCHAOS_WHEELHOUSE``'s wheels.
CONTEXT_WHEELHOUSE = ".kvchaos-wheelhouse"


# --- the engine and the compose CLI ----------------------------------------------------------

def docker_client(timeout_s: float = 120.0) -> docker.DockerClient:
    """A client of the Docker engine from the environment (``DOCKER_HOST`` or the local socket).

    Raises:
        StackError: no engine answers (``docker info`` fails): run scripts/docker-setup.sh.
    """
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except docker.errors.DockerException as exc:
        raise StackError(f"no Docker engine answers ({exc}); start one (scripts/docker-setup.sh) "
                         "or use the local backend") from exc
    return client


def engine_available() -> tuple[bool, str]:
    """Whether a Docker engine and a compose CLI are usable here.

    Returns:
        ``(True, "engine <version>, <compose argv>")`` or ``(False, reason)``.
    """
    try:
        client = docker_client(timeout_s=10)
        version = client.version().get("Version", "?")
        client.close()
        cmd = compose_command()
    except StackError as exc:
        return False, str(exc)
    return True, f"engine {version}, {' '.join(cmd)}"


def compose_command() -> list[str]:
    """The compose CLI as argv: ``$KVCHAOS_COMPOSE`` (split like a shell), else ``docker compose``
    (v2) when that answers, else ``docker-compose`` (v1).

    Raises:
        StackError: none of them is installed.
    """
    override = os.environ.get("KVCHAOS_COMPOSE")
    if override:
        return shlex.split(override)
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise StackError("neither `docker compose` nor `docker-compose` is installed "
                     "(scripts/docker-setup.sh installs docker-compose)")


# --- the resolved compose file ----------------------------------------------------------------

def _duration(seconds: float) -> str:
    """A compose duration both v1 and v2 parse (integer milliseconds)."""
    return f"{int(round(seconds * 1000))}ms"


def _escape_dollars(data: Any) -> Any:
    """Escape ``$`` as ``$$`` in every string so that compose does not interpolate again."""
    if isinstance(data, str):
        return data.replace("$", "$$")
    if isinstance(data, dict):
        return {k: _escape_dollars(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_escape_dollars(v) for v in data]
    return data


def _healthcheck(hc: HealthCheck) -> dict[str, Any]:
    """A compose healthcheck with every timing explicit (Docker's default interval is 30 s)."""
    test = hc.test if isinstance(hc.test, list) else ["CMD-SHELL", hc.test]
    out: dict[str, Any] = {"test": test, "interval": _duration(hc.interval), "timeout": _duration(hc.timeout),
                           "retries": max(hc.retries, 1), "start_period": _duration(hc.start_period)}
    if hc.disable:
        out = {"disable": True}
    return out


def default_image_name(stack_path: Path, service: str) -> str:
    """The image a ``build:`` service without ``image:`` is tagged with (stable across runs)."""
    stem = "".join(c if c.isalnum() else "-" for c in stack_path.stem.lower()).strip("-") or "stack"
    return f"kvchaos-local/{stem}-{service.lower()}:latest"


def host_probe_url(spec: StackSpec, service: str) -> str | None:
    """The URL kvchaos probes from the host for ``service``: its health check is
    ``kvchaos probe URL`` and it uses ``network_mode: host``; else None (Docker runs the check)."""
    svc = spec.services[service]
    argv = svc.healthcheck.argv() if svc.healthcheck is not None else None
    if not argv or svc.network_mode != "host":
        return None
    return probe_url_of(argv)


def resolved_compose(spec: StackSpec, run_id: str, run_dir: Path) -> dict[str, Any]:
    """The compose document ComposeStack runs: the stack file with every variable replaced by
    the value ``spec.env`` holds (so the ports are the ones LocalStack would use), plus, per
    service: kvchaos labels, the telemetry-off environment, the run dir bind-mounted at its own
    path, explicit health-check timings (or none, for checks kvchaos runs from the host, see
    :func:`host_probe_url`), ``depends_on`` as a plain list and an image name for ``build:``
    services. The top-level ``name`` goes (compose v1 rejects it; ``-p`` names the project).

    Returns:
        A dict ready for ``yaml.safe_dump``; ``$`` in values is escaped as ``$$``.
    """
    raw, _ = load_yaml(spec.path)
    doc = interpolate_data(raw, spec.env)
    doc.pop("name", None)
    services: dict[str, Any] = doc["services"]
    stack_path = Path(spec.path).resolve()
    for name, svc in spec.services.items():
        out = services[name]
        out.pop("x-kvchaos-local", None)
        labels = dict(svc.labels) if isinstance(svc.labels, dict) else dict(
            (item.partition("=")[0], item.partition("=")[2]) for item in (svc.labels or []))
        labels.update({LABEL_RUN: run_id, LABEL_STACK: str(stack_path)})
        out["labels"] = labels
        out["environment"] = {**svc.env(), **TELEMETRY_OFF}
        volumes = list(out.get("volumes") or [])
        mount = f"{run_dir}:{run_dir}"
        if not any(isinstance(v, str) and v.split(":")[0] == str(run_dir) for v in volumes):
            volumes.append(mount)
        out["volumes"] = volumes
        if host_probe_url(spec, name) is not None:
            out["healthcheck"] = {"disable": True}
        elif svc.healthcheck is not None:
            out["healthcheck"] = _healthcheck(svc.healthcheck)
        if svc.depends_on:
            out["depends_on"] = sorted(svc.dependencies())
        if svc.build is not None and not svc.image:
            out["image"] = default_image_name(stack_path, name)
    return _escape_dollars(doc)


# --- images -------------------------------------------------------------------------------------

def build_context_tar(context: Path, dockerfile: str, wheelhouse: Path | None = None) -> tempfile.SpooledTemporaryFile:
    """A tar of the build context for the engine's build API.

    Files matching ``.dockerignore`` (when present) or :data:`BUILD_CONTEXT_EXCLUDES` are left
    out; the wheels of ``wheelhouse`` (a folder anywhere) are added under
    :data:`CONTEXT_WHEELHOUSE`/.

    Args:
        context: the build context folder.
        dockerfile: the Dockerfile, relative to ``context``.
        wheelhouse: a folder of ``*.whl`` files, or None.

    Returns:
        A file object positioned at 0 (uncompressed tar).

    Raises:
        FileNotFoundError: ``context`` or the Dockerfile does not exist.
    """
    context = Path(context)
    if not (context / dockerfile).is_file():
        raise FileNotFoundError(f"no Dockerfile at {context / dockerfile}")
    patterns = list(BUILD_CONTEXT_EXCLUDES)
    ignore = context / ".dockerignore"
    if ignore.is_file():
        patterns += [ln.strip() for ln in ignore.read_text().splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")]
    f = tempfile.SpooledTemporaryFile(max_size=64 << 20)
    with tarfile.open(fileobj=f, mode="w") as tar:
        for rel in sorted(exclude_paths(str(context), patterns, dockerfile=dockerfile)):
            full = context / rel
            if full.is_dir() and not full.is_symlink():
                tar.add(full, arcname=rel, recursive=False)
            else:
                tar.add(full, arcname=rel)
        if wheelhouse is not None:
            info = tarfile.TarInfo(CONTEXT_WHEELHOUSE)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
            for whl in sorted(Path(wheelhouse).glob("*.whl")):
                tar.add(whl, arcname=f"{CONTEXT_WHEELHOUSE}/{whl.name}")
    f.seek(0)
    return f


def build_image(tag: str, context: Path, dockerfile: str = "Dockerfile", *,
                buildargs: dict[str, str] | None = None, target: str | None = None,
                wheelhouse: Path | None = None, log_path: Path | None = None,
                client: docker.DockerClient | None = None) -> float:
    """Build ``tag`` from ``context`` with the host's network (the legacy builder's API).

    Args:
        tag: image name, e.g. ``kvchaos/stack:dev``.
        context: build context folder; dockerfile: path relative to it.
        buildargs: ``--build-arg`` values; ``WHEELHOUSE`` is set when ``wheelhouse`` is given.
        target: the stage to build (``--target``), or None for the last.
        wheelhouse: folder of wheels to ship in the context (see :func:`build_context_tar`).
        log_path: where the build output goes (appended), or None.
        client: a Docker client (a new one when None).

    Returns:
        Seconds the build took.

    Raises:
        StackError: the build failed; the message carries the last lines of its output.
    """
    client = client or docker_client()
    args = dict(buildargs or {})
    if wheelhouse is not None:
        args["WHEELHOUSE"] = CONTEXT_WHEELHOUSE
    start = time.monotonic()
    tail: list[str] = []
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    try:
        with build_context_tar(context, dockerfile, wheelhouse) as ctx:
            stream = client.api.build(fileobj=ctx, custom_context=True, dockerfile=dockerfile, tag=tag,
                                      buildargs=args, target=target, network_mode="host", rm=True,
                                      forcerm=True, decode=True)
            for chunk in stream:
                text = chunk.get("stream") or chunk.get("status") or ""
                if "error" in chunk:
                    text = f"ERROR: {chunk['error']}\n"
                if text:
                    if log:
                        log.write(text)
                    tail = (tail + text.splitlines())[-30:]
                if "error" in chunk:
                    raise StackError(f"building image {tag} from {context} failed: {chunk['error'].strip()}",
                                     None, "\n".join(tail))
    except docker.errors.APIError as exc:
        raise StackError(f"building image {tag} from {context} failed: {exc}", None, "\n".join(tail)) from exc
    finally:
        if log:
            log.close()
    return time.monotonic() - start


#: The image of the real Toxiproxy that :func:`build_toxiproxy_image` builds (compose/reference.yml's
#: default ``TOXIPROXY_IMAGE``).
TOXIPROXY_IMAGE = "kvchaos/toxiproxy:2.9.0"
TOXIPROXY_DOCKERFILE = Path(__file__).resolve().parents[2] / "compose" / "toxiproxy.Dockerfile"


def toxiproxy_version(binary: Path) -> str:
    """``2.9.0`` from ``toxiproxy-server -version`` (chaos/proxy/real.py ``binary_version``).

    Raises:
        StackError: the binary does not run or is not Toxiproxy.
    """
    from chaos.proxy.real import MissingToxiproxy, binary_version

    try:
        return binary_version(binary)
    except MissingToxiproxy as exc:
        raise StackError(str(exc)) from None


def build_toxiproxy_image(binary: Path | None = None, tag: str | None = None, *,
                          client: docker.DockerClient | None = None, log_path: Path | None = None) -> str:
    """Build the real Toxiproxy's image from its static binary, with no registry
    (compose/toxiproxy.Dockerfile, ``FROM scratch``): the binary is copied into a temporary
    build context at build time.

    Args:
        binary: ``toxiproxy-server`` (default: :func:`chaos.proxy.real.find_binary`).
        tag: image name (default ``kvchaos/toxiproxy:<the binary's version>``).

    Returns:
        The tag built.

    Raises:
        MissingToxiproxy: no binary; StackError: the build failed.
    """
    from chaos.proxy.real import find_binary

    binary = Path(binary) if binary is not None else find_binary()
    tag = tag or f"kvchaos/toxiproxy:{toxiproxy_version(binary)}"
    with tempfile.TemporaryDirectory(prefix="kvchaos-toxiproxy-ctx-") as ctx:
        shutil.copy2(binary, Path(ctx) / "toxiproxy-server")
        shutil.copy2(TOXIPROXY_DOCKERFILE, Path(ctx) / "Dockerfile")
        build_image(tag, Path(ctx), "Dockerfile", client=client, log_path=log_path)
    return tag


def image_exists(client: docker.DockerClient, image: str) -> bool:
    """True when ``image`` is present in the local engine."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


# --- cleanup --------------------------------------------------------------------------------------

def remove_project(project: str, client: docker.DockerClient | None = None) -> dict[str, list[str]]:
    """Remove every container, network and volume of one compose project (force, no grace).

    Returns:
        ``{"containers": [names], "networks": [names], "volumes": [names]}`` removed.
    """
    client = client or docker_client()
    return _sweep(client, lambda labels: labels.get(LABEL_PROJECT) == project)


def _sweep(client: docker.DockerClient, match: Any) -> dict[str, list[str]]:
    removed: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}
    for c in client.containers.list(all=True, ignore_removed=True):
        if match(c.labels or {}):
            try:
                c.remove(force=True, v=True)
                removed["containers"].append(c.name)
            except docker.errors.NotFound:
                pass
    for n in client.networks.list(filters={"label": LABEL_PROJECT}):
        if match(n.attrs.get("Labels") or {}):
            try:
                n.remove()
                removed["networks"].append(n.name)
            except docker.errors.NotFound:
                pass
    for v in client.volumes.list(filters={"label": LABEL_PROJECT}):
        if match(v.attrs.get("Labels") or {}):
            try:
                v.remove(force=True)
                removed["volumes"].append(v.name)
            except docker.errors.NotFound:
                pass
    return removed


def project_name(run_id: str) -> str:
    """The compose project of a run: ``kvchaos-<run id>``, lowercase, ``[a-z0-9_-]`` only."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id.lower())
    return name if name.startswith(PROJECT_PREFIX) else PROJECT_PREFIX + name


# --- the stack ------------------------------------------------------------------------------------

class ComposeStack(Stack):
    """Run a stack file's services as containers of one compose project.

    Args:
        path: the stack file.
        run_dir: scratch folder (resolved compose file, logs, ``${KVCHAOS_RUN_DIR}``); a new
            folder under the state directory when None.
        environ: base variables (``os.environ`` when None).
        run_id: names the project (``kvchaos-<run id>``) and the journal.
        journal: an existing journal to record into (the runner's), else a new one.
        spec: an already loaded stack file (skips loading ``path``).
        build: build missing images of ``build:`` services in ``up()`` (else raise).

    Raises:
        ConfigError: the stack file is invalid.
        StackError: no Docker engine answers, or no compose CLI is installed.
    """

    backend = "compose"

    def __init__(self, path: str | Path, *, run_dir: Path | None = None,
                 environ: dict[str, str] | None = None, run_id: str | None = None,
                 journal: Journal | None = None, spec: StackSpec | None = None,
                 build: bool = True) -> None:
        self.run_id = run_id or new_run_id(Path(path).stem)
        if run_dir is None:
            from chaos.journal import state_dir
            run_dir = state_dir() / "stacks" / self.run_id
        run_dir = Path(run_dir).resolve()
        spec = spec or load_stack(path, environ=environ, run_dir=run_dir, require_commands=False)
        super().__init__(spec, run_dir)
        self.project = project_name(self.run_id)
        self.compose_file = self.run_dir / "compose.resolved.yml"
        self.log_dir = self.run_dir / "logs"
        self.journal = journal or Journal(self.run_id)
        self.build = build
        self.compose = compose_command()
        self.client = docker_client()
        self._lock = threading.RLock()
        # Exits are keyed by (container id, StartedAt): one container restarts many times.
        self._expected: set[tuple[str, str]] = set()
        self._recorded: set[tuple[str, str]] = set()
        # Services whose host-side probe passed since they last started (see host_probe_url).
        self._healthy: set[str] = set()
        # Services whose command or environment changed since their container was created
        # (set_variables): start() re-creates their container from the rewritten compose file.
        self._recreate: set[str] = set()

    # --- compose CLI ---------------------------------------------------------------------
    def _compose(self, *args: str, timeout_s: float = 600.0, check: bool = True) -> subprocess.CompletedProcess:
        argv = [*self.compose, "-p", self.project, "-f", str(self.compose_file),
                "--project-directory", str(Path(self.spec.path).resolve().parent), *args]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                               env={**os.environ, "COMPOSE_PROJECT_NAME": self.project}, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"`{' '.join(argv)}` did not finish within {timeout_s:.0f}s") from exc
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "compose.log", "a", encoding="utf-8") as log:
            log.write(f"$ {shlex.join(argv)}\n{r.stdout}{r.stderr}(exit {r.returncode})\n")
        if check and r.returncode != 0:
            raise StackError(f"`{' '.join(args[:1])}` failed for project {self.project} (exit {r.returncode})",
                             None, "\n".join((r.stdout + r.stderr).splitlines()[-30:]))
        return r

    def write_compose_file(self, doc: dict[str, Any] | None = None) -> Path:
        """Write ``doc`` (default: :func:`resolved_compose` of this stack) to
        ``<run_dir>/compose.resolved.yml``; returns its path."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if doc is None:
            doc = resolved_compose(self.spec, self.run_id, self.run_dir)
        self.compose_file.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
        return self.compose_file

    # --- containers ----------------------------------------------------------------------
    def _containers(self, service: str | None = None) -> list[Container]:
        filters = [f"{LABEL_PROJECT}={self.project}"]
        if service is not None:
            filters.append(f"{LABEL_SERVICE}={service}")
        return self.client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)

    def container(self, service: str) -> Container:
        """The service's container (the newest when compose made several).

        Raises:
            StackError: unknown service, or it has no container (not started).
        """
        if service not in self.spec.services:
            raise StackError(f"unknown service {service!r} (services: {', '.join(self.spec.services)})", service)
        found = self._containers(service)
        if not found:
            raise StackError(f"service {service!r} is not started (no container in project {self.project})",
                             service)
        return max(found, key=lambda c: c.attrs.get("Created", ""))

    def _log_tail(self, service: str, lines: int = 30) -> str:
        try:
            return self.container(service).logs(tail=lines).decode("utf-8", "replace")
        except (StackError, docker.errors.APIError):
            return ""

    def _proxy_info(self, service: str) -> dict[str, str]:
        """From the proxy service's container: ``bundled`` when it runs ``kvchaos proxy serve``
        (in the engine's image), else ``real`` with the image (``kvchaos/toxiproxy:2.9.0``)."""
        c = self.container(service)
        image = (c.attrs.get("Config") or {}).get("Image") or ""
        cmd = " ".join((c.attrs.get("Config") or {}).get("Cmd") or [])
        if "proxy serve" in cmd and "--impl real" not in cmd:
            import chaos

            return {"impl": "bundled", "version": chaos.__version__, "image": image}
        version = image.rpartition(":")[2] if ":" in image else ""
        return {"impl": "real", "version": version, "image": image}

    def service_log_tail(self, name: str) -> str:
        return self._log_tail(name)

    @staticmethod
    def _container_pids(c: Container) -> set[int]:
        """The host pids of a running container's processes: its init (``State.Pid``) and every
        descendant; empty when it does not run."""
        pid = int((c.attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return set()
        try:
            root = psutil.Process(pid)
            return {pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            return set()

    def own_pids(self) -> set[int] | None:
        """The host pids of every container of this project (each init and its descendants)."""
        pids: set[int] = set()
        try:
            for c in self._containers():
                pids |= self._container_pids(c)
        except docker.errors.APIError:
            return None
        return pids

    def service_pids(self, name: str) -> set[int] | None:
        """The host pids of the service's container; None unless it uses ``network_mode: host``
        (a container with its own network namespace listens where the host's ``ss`` cannot see,
        and a published port is held by Docker's own proxy)."""
        if self.spec.services[name].network_mode != "host":
            return None
        try:
            c = self.container(name)
            c.reload()
        except (StackError, docker.errors.APIError):
            return None
        return self._container_pids(c)

    def foreign_listeners(self, name: str) -> list[str]:
        """As :meth:`Stack.foreign_listeners`, for ``network_mode: host`` services only (a
        published port of another network namespace is held by Docker's proxy, not a stranger)."""
        if self.spec.services[name].network_mode != "host":
            return []
        return super().foreign_listeners(name)

    def lost_binds(self, name: str) -> list[str]:
        """As :meth:`Stack.lost_binds`, for ``network_mode: host`` services only."""
        if self.spec.services[name].network_mode != "host":
            return []
        return super().lost_binds(name)

    @staticmethod
    def _run_key(c: Container) -> tuple[str, str]:
        return c.id, c.attrs.get("State", {}).get("StartedAt", "")

    # --- images --------------------------------------------------------------------------
    def ensure_images(self, doc: dict[str, Any]) -> None:
        """Make sure every service of the resolved document ``doc`` has its image, changing
        ``doc`` where a service must run from another image:

        1. ``KVCHAOS_PULL=1``: ``compose pull`` the services whose image is missing (kvchaos
           never contacts a registry otherwise);
        2. a ``build:`` service whose image is missing is built (:func:`build_image`), once per
           image;
        3. the proxy service (``x-kvchaos.proxy.service``) whose image is still missing runs
           kvchaos's own proxy instead: its ``x-kvchaos-local.command`` in the engine's image
           (DESIGN.md: the real Toxiproxy where it can be pulled, ours where it cannot).

        Raises:
            StackError: an image is missing and cannot be pulled, built or replaced, or a build
                failed.
        """
        services: dict[str, Any] = doc["services"]
        missing = [n for n, svc in services.items() if not svc.get("image")
                   or not image_exists(self.client, svc["image"])]
        if missing and os.environ.get("KVCHAOS_PULL") == "1":
            pullable = [n for n in missing if services[n].get("build") is None]
            if pullable:
                self.write_compose_file(doc)
                self._compose("pull", "--ignore-pull-failures", *pullable, check=False, timeout_s=1800)
            missing = [n for n in missing if not image_exists(self.client, services[n]["image"])]
        base = Path(self.spec.path).resolve().parent
        for name in list(missing):
            svc = services[name]
            build = svc.get("build")
            if build is None or not self.build or image_exists(self.client, svc["image"]):
                continue
            build = {"context": build} if isinstance(build, str) else dict(build)
            args = build.get("args") or {}
            if isinstance(args, list):
                args = dict((a.partition("=")[0], a.partition("=")[2]) for a in args)
            args = {k: str(v).replace("$$", "$") for k, v in args.items()}
            if os.environ.get("KVCHAOS_BASE_IMAGE"):
                args.setdefault("BASE_IMAGE", os.environ["KVCHAOS_BASE_IMAGE"])
            context = base / build.get("context", ".")
            wheelhouse = Path(os.environ.get("KVCHAOS_WHEELHOUSE") or context / DEFAULT_WHEELHOUSE)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            build_image(svc["image"], context, build.get("dockerfile", "Dockerfile"),
                        buildargs=args, target=build.get("target"),
                        wheelhouse=wheelhouse if any(wheelhouse.glob("*.whl")) else None,
                        log_path=self.log_dir / f"build-{name}.log", client=self.client)
        missing = [n for n in missing if not image_exists(self.client, services[n]["image"])]
        proxy = self.settings.proxy.service if self.settings.proxy is not None else None
        if proxy is not None:
            missing = self._choose_proxy_image(services, proxy, missing)
        if missing:
            name = missing[0]
            raise StackError(f"service {name!r}: image {services[name].get('image')!r} is not present"
                             + (" and the service has no build:" if services[name].get("build") is None
                                else " and building is off")
                             + "; build or load it (compose/README.md), or set KVCHAOS_PULL=1 where a "
                             "registry is reachable", name)

    def _choose_proxy_image(self, services: dict[str, Any], proxy: str, missing: list[str]) -> list[str]:
        """The proxy service's image by the stack variable ``KVCHAOS_PROXY``
        (chaos/proxy/real.py):

        - ``real``: the service's image (the real Toxiproxy's); when it is missing and is
          kvchaos's own tag (``kvchaos/toxiproxy:*``), it is built from the binary
          (:func:`build_toxiproxy_image`); never replaced by the bundled proxy;
        - ``bundled``: kvchaos's proxy (the service's ``x-kvchaos-local.command`` with
          ``--impl bundled``) in the engine's image, even when the real image is present;
        - unset: the real image when present (or buildable from a binary that is found), else
          the bundled proxy in the engine's image.

        Returns:
            ``missing`` without the proxy service when it now has an image.

        Raises:
            StackError: ``KVCHAOS_PROXY`` has a bad value, or ``bundled`` with no engine image.
        """
        from chaos.proxy.real import MissingToxiproxy, selected_impl

        try:
            impl = selected_impl(self.env)
        except ValueError as exc:
            raise StackError(str(exc), proxy) from None
        image = services[proxy].get("image") or ""
        if impl != "bundled" and proxy in missing and image.startswith("kvchaos/toxiproxy:"):
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                build_toxiproxy_image(tag=image, client=self.client, log_path=self.log_dir / f"build-{proxy}.log")
            except MissingToxiproxy as exc:
                if impl == "real":
                    raise StackError(f"service {proxy!r}: image {image!r} is not present and cannot be "
                                     f"built: {exc}", proxy) from None
            if image_exists(self.client, image):
                missing = [n for n in missing if n != proxy]
        if impl == "real" or (impl is None and proxy not in missing):
            return missing
        local = self.spec.services[proxy].local_command()
        engine = self.settings.engine
        own = services.get(engine, {}).get("image") if engine else None
        if local is not None and own and image_exists(self.client, own):
            argv = self.spec.services[proxy].argv("local")
            if "--impl" in argv:  # the engine's image has no toxiproxy-server
                argv[argv.index("--impl") + 1] = "bundled"
            services[proxy].update({"image": own, "command": _escape_dollars(argv), "entrypoint": []})
            services[proxy].pop("build", None)
            missing = [n for n in missing if n != proxy]
        elif impl == "bundled":
            raise StackError(f"service {proxy!r}: --proxy bundled runs kvchaos's proxy in the engine's image, "
                             f"and {own!r} is not present", proxy)
        return missing

    # --- lifecycle -----------------------------------------------------------------------
    def up(self) -> None:
        """Write the resolved compose file, build missing images, then start the services
        wave by wave (``up -d --no-deps``), waiting on ``service_healthy`` dependencies and, at
        the end, on every service's health check; the proxy's links are created as soon as the
        proxy service is healthy.

        Raises:
            StackError: an image is missing, compose failed, or a service exited or stayed
                unhealthy; the stack is brought down (containers removed) first.
        """
        doc = resolved_compose(self.spec, self.run_id, self.run_dir)
        self.write_compose_file(doc)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.journal.add("compose_project", self.project, project=self.project,
                         compose_file=str(self.compose_file), compose=self.compose)
        self._save_state()
        try:
            self._mount_l2()
            self.ensure_images(doc)
            self.write_compose_file(doc)
            if self.settings.proxy is not None and self.settings.proxy.service is None:
                self.populate_links()
            self._start_in_dependency_order(
                list(self.spec.services),
                lambda names: self._compose("up", "-d", "--no-deps", "--no-build", *names),
                self._wait_many)
        except BaseException as exc:
            down_after_failed_up(self, exc)
            raise

    def _wait_many(self, names: list[str]) -> None:
        if not names:
            return
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            futures = {n: pool.submit(self.wait_healthy, n) for n in names}
            errors = [exc for f in futures.values() if (exc := f.exception()) is not None]
            if errors:
                raise errors[0]
        proxy = self.settings.proxy
        if proxy is not None and proxy.service in names:
            self._populate_links_or_raise()

    def _populate_links_or_raise(self) -> None:
        proxy = self.settings.proxy
        try:
            self.populate_links()
        except StackError:
            raise
        except Exception as exc:  # the proxy answered health but not the API
            raise StackError(f"could not create the proxy links on {proxy.api}: {exc}",
                             proxy.service, self._log_tail(proxy.service)) from exc

    def _health(self, service: str) -> bool:
        """One look at the container: True healthy (or running, without a health check).

        Raises:
            StackError: the container is gone or has exited.
        """
        if interrupts.startup_interrupted():  # the stack goes down: stop waiting (worker threads)
            raise StackError(f"start-up of {service!r} interrupted", service)
        c = self.container(service)
        c.reload()
        state = c.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead") or (not state.get("Running") and state.get("Status") != "created"):
            lost = self.lost_binds(service)
            why = f"; {'; '.join(lost)} (a lost bind)" if lost else ""
            raise StackError(f"service {service!r} exited (code {state.get('ExitCode')}) before it became healthy{why}",
                             service, self._log_tail(service), exited=not lost)
        url = host_probe_url(self.spec, service)
        if url is not None:
            hc = self.spec.services[service].healthcheck
            if state.get("Status") != "running" or not probe(url, timeout_s=hc.timeout)[0]:
                return False
            self.check_identity(service, url)  # a process outside the container must not pass
            return True
        health = state.get("Health")
        if health is None:
            return bool(state.get("Running"))
        if health.get("Status") != "healthy":
            return False
        self._check_checked_ports(service)
        return True

    def _check_checked_ports(self, service: str) -> None:
        """After Docker's own health check passed in a ``network_mode: host`` container: each
        port of the stack's ``*_PORT`` variables that the check names must be listened on by the
        stack's own containers, or the check may have been answered by another process of the
        host (a concurrent stack)."""
        import re

        from chaos.stack.probe import listeners

        hc = self.spec.services[service].healthcheck
        argv = hc.argv() if hc is not None else None
        if not argv or self.service_pids(service) is None:
            return
        mine = None
        text = " ".join(argv)
        for var, value in sorted(self.env.items()):
            if not (var.endswith("_PORT") and value.isdigit() and re.search(rf"(?<![0-9]){value}(?![0-9])", text)):
                continue
            owners = listeners(int(value))
            if owners and mine is None:
                mine = self.own_pids() or set()  # a port of another service of the stack is ours too
            if owners and not any(o.pid in mine for o in owners):
                raise StackError(
                    f"service {service!r}: its health check ({text}) passed, but port {value} ({var}) is "
                    f"held by {', '.join(o.describe() for o in owners)}, not by this stack's containers: another "
                    "process answered; stop it or set the port variable", service, self._log_tail(service))

    def wait_healthy(self, service: str, timeout_s: float | None = None) -> None:
        """Poll the container's health status (Docker runs the health check in the container)
        until it is ``healthy``; a service without a health check only has to be running.

        Raises:
            StackError: the container exited, or the deadline (``timeout_s``, default the health
                check's start_period + retries * (interval + timeout)) passed; the message carries
                the container's last log lines.
        """
        hc = self.spec.services[service].healthcheck
        has_check = hc is not None and hc.argv() is not None
        deadline = timeout_s if timeout_s is not None else (hc.deadline_s if has_check else NO_HEALTHCHECK_WAIT_S)
        retrying = Retrying(stop=stop_after_delay(deadline), wait=wait_fixed(0.25),
                            retry=retry_if_result(lambda ok: not ok), retry_error_callback=lambda _s: False)
        if not retrying(self._health, service):
            raise StackError(f"service {service!r} not healthy after {deadline:.0f}s "
                             f"(health check {hc.test if hc else None})", service, self._log_tail(service))
        with self._lock:
            self._healthy.add(service)

    def status(self) -> dict[str, ServiceStatus]:
        """State of each service's container; records exits it notices (see :attr:`exits`)."""
        out: dict[str, ServiceStatus] = {}
        by_service: dict[str, Container] = {}
        for c in sorted(self._containers(), key=lambda c: c.attrs.get("Created", "")):
            by_service[c.labels.get(LABEL_SERVICE, "")] = c
        with self._lock:
            for name in self.spec.services:
                c = by_service.get(name)
                if c is None:
                    out[name] = ServiceStatus(name, "not-started")
                    continue
                st = c.attrs.get("State", {})
                status = st.get("Status", "")
                state = {"running": "running", "restarting": "running", "paused": "paused",
                         "created": "not-started"}.get(status, "exited")
                rc = None if state in ("running", "paused") else st.get("ExitCode")
                key = self._run_key(c)
                if state == "exited" and key not in self._recorded:
                    self._recorded.add(key)
                    self.exits.append(ServiceExit(name, time.time(), rc, key in self._expected))
                health = (st.get("Health") or {}).get("Status")
                if host_probe_url(self.spec, name) is not None:
                    health = "healthy" if name in self._healthy else "starting"
                healthy = (health == "healthy" if health else state == "running") if state == "running" else False
                out[name] = ServiceStatus(name, state, st.get("Pid") or None, healthy, rc,
                                          {"container": c.name, "id": c.short_id, "image": c.attrs.get(
                                              "Config", {}).get("Image"), "docker_status": status,
                                           "health": health})
        return out

    # --- faults --------------------------------------------------------------------------
    def kill(self, service: str, sig: str | int = "SIGKILL") -> None:
        """Send ``sig`` to the container's main process (``docker kill --signal``); SIGKILL
        waits until the container has stopped. The exit is recorded as expected.

        Raises:
            StackError: unknown or not-started service, or the engine refused.
            ValueError: unknown signal.
        """
        name = signal.Signals(signal_number(sig)).name
        c = self.container(service)
        c.reload()
        with self._lock:
            self._expected.add(self._run_key(c))
            self._healthy.discard(service)
        if c.status == "paused" and name not in ("SIGKILL", "SIGSTOP", "SIGCONT"):
            c.unpause()
        try:
            c.kill(signal=name)
        except docker.errors.APIError as exc:
            raise StackError(f"could not send {name} to service {service!r}: {exc}", service) from exc
        if name == "SIGKILL":
            try:
                c.wait(timeout=KILL_WAIT_S)
            except Exception:  # requests' ReadTimeout: reported by status() as still running
                pass
        self.status()

    def stop(self, service: str) -> None:
        """``docker stop``: the service's stop_signal, then SIGKILL after its stop_grace_period."""
        try:
            c = self.container(service)
        except StackError:
            return
        c.reload()
        with self._lock:
            self._expected.add(self._run_key(c))
            self._healthy.discard(service)
        if c.status == "paused":
            c.unpause()
        if c.status in ("running", "paused", "restarting"):
            c.stop(timeout=int(max(1, round(self.spec.services[service].stop_grace_period))))
        self.status()

    def set_variables(self, variables: dict[str, str]) -> list[str]:
        """:meth:`Stack.set_variables`, and the resolved compose file written again with them,
        so that the services whose command or environment changed get new containers when they
        start (:meth:`start`): a stopped container started again keeps the configuration it was
        created with (before, ``reconfigure`` of a compose stack restarted the engine with the
        previous scenario's ``KVCHAOS_ENGINE_BUGS`` still set).

        Returns:
            The services whose command or environment changed.

        Raises:
            ConfigError: the file no longer validates; StackError: an image is missing.
        """
        changed = super().set_variables(variables)
        if self.compose_file.exists():  # up() writes it (a stack that is down is written then)
            doc = resolved_compose(self.spec, self.run_id, self.run_dir)
            self.ensure_images(doc)
            self.write_compose_file(doc)
            with self._lock:
                self._recreate.update(changed)
        return changed

    def start(self, service: str, wait: bool = True) -> None:
        """Start the service's stopped container (or create it; a new one when its command or
        environment changed since its container was created, see :meth:`set_variables`); waits
        for health when ``wait`` and re-creates the proxy links when the service is the proxy."""
        if service not in self.spec.services:
            raise StackError(f"unknown service {service!r}", service)
        found = self._containers(service)
        with self._lock:
            self._healthy.discard(service)
            recreate = service in self._recreate
            self._recreate.discard(service)
        if recreate:
            self.status()  # record the exit of the container being replaced
            self.log_dir.mkdir(parents=True, exist_ok=True)
            for c in found:  # its log goes with it: kept beside the new container's
                try:
                    (self.log_dir / f"{service}.{c.short_id}.log").write_bytes(
                        c.logs(stdout=True, stderr=True, timestamps=True))
                except docker.errors.APIError:
                    pass
            self._compose("up", "-d", "--no-deps", "--no-build", "--force-recreate", service)
        elif found:
            c = max(found, key=lambda c: c.attrs.get("Created", ""))
            if c.status == "running":
                return
            self.status()  # record the exit before the container's StartedAt changes
            c.start()
        else:
            self._compose("up", "-d", "--no-deps", "--no-build", service)
        if wait:
            self.wait_healthy(service)
            proxy = self.settings.proxy
            if proxy is not None and proxy.service == service:
                self._populate_links_or_raise()

    def pause(self, service: str) -> None:
        """``docker pause`` (cgroup freezer): every process of the container stops."""
        self.container(service).pause()

    def resume(self, service: str) -> None:
        """``docker unpause``."""
        self.container(service).unpause()

    # --- teardown ------------------------------------------------------------------------
    def collect_logs(self, dest_dir: Path) -> list[Path]:
        """Write each service container's log (stdout + stderr, with timestamps) to
        ``dest_dir/<service>.log``; also copies ``compose.log`` and build logs when present.

        Returns:
            The files written.
        """
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        out: list[Path] = []
        for c in sorted(self._containers(), key=lambda c: c.attrs.get("Created", "")):
            service = c.labels.get(LABEL_SERVICE, c.name)
            target = dest_dir / f"{service}.log"
            try:
                target.write_bytes(c.logs(stdout=True, stderr=True, timestamps=True))
            except docker.errors.APIError:
                continue
            if target not in out:
                out.append(target)
        if dest_dir.resolve() != self.log_dir.resolve() and self.log_dir.is_dir():
            for f in sorted(self.log_dir.glob("*.log")):
                if f.name == "compose.log" or f.name.startswith("build-"):
                    shutil.copyfile(f, dest_dir / f.name)
                    out.append(dest_dir / f.name)
        return out

    def down(self) -> None:
        """Save the containers' logs into ``<run_dir>/logs``, ``compose down`` (containers,
        networks, volumes, orphans), then remove whatever of the project is still there through
        the engine and unmount the filesystem L2; removes ``state.json`` and closes the journal
        entries of what is gone. Each step runs whatever the one before it raised. Safe to call
        twice.

        Raises:
            StackError: the project's containers could not be removed or the filesystem L2
                could not be unmounted (each named); their journal entries stay open, so
                ``kvchaos cleanup`` undoes them once this run has ended.
        """
        left: list[str] = []
        try:
            try:
                self.collect_logs(self.log_dir)
            except Exception:  # never let log collection keep containers alive
                pass
            grace = max([int(s.stop_grace_period) for s in self.spec.services.values()] + [1])
            if self.compose_file.exists():
                try:
                    self._compose("down", "--volumes", "--remove-orphans", "--timeout", str(grace),
                                  timeout_s=120 + 2 * grace, check=False)
                except StackError:
                    pass
        finally:
            try:
                remove_project(self.project, self.client)
                self.journal.remove("compose_project", self.project)
            except Exception as exc:  # the engine did not answer or refused: cleanup retries
                left.append(f"compose project {self.project}: {type(exc).__name__}: {exc}")
            try:
                self._unmount_l2()
            except StackError as exc:
                left.append(str(exc))
            state = self.run_dir / "state.json"
            if state.exists():
                state.unlink()
            self.journal.close()
        if left:
            raise StackError("stack down left " + "; ".join(left) + "; " + cleanup_hint(self.journal))

    # --- filesystem L2 ------------------------------------------------------------------
    # The same host tmpfs as LocalStack's (one implementation; it only needs settings + journal).
    def _mount_l2(self) -> None:
        LocalStack._mount_l2(self)  # type: ignore[arg-type]

    def _unmount_l2(self) -> None:
        LocalStack._unmount_l2(self)  # type: ignore[arg-type]

    # --- state for detached stacks ---------------------------------------------------------
    def _save_state(self) -> None:
        state = {"backend": self.backend, "stack_file": str(Path(self.spec.path).resolve()),
                 "run_id": self.run_id, "project": self.project, "journal": str(self.journal.path),
                 "env": {k: v for k, v in self.env.items() if k.endswith("_PORT") or k.startswith("KVCHAOS_")}}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "state.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / "state.json")

    @classmethod
    def attach(cls, run_dir: Path) -> "ComposeStack":
        """Re-attach to a stack started by another process (``kvchaos stack up``) from its
        ``<run_dir>/state.json``.

        Raises:
            FileNotFoundError: no state in ``run_dir``.
        """
        run_dir = Path(run_dir)
        state = json.loads((run_dir / "state.json").read_text())
        environ = {**os.environ, **state["env"]}
        journal = Journal(state["run_id"], directory=Path(state["journal"]).parent)
        # Its ports are its own (state.json), claimed or not since `stack up` ended: never refused.
        spec = load_stack(state["stack_file"], environ=environ, run_dir=run_dir.resolve(), require_commands=False,
                          refuse_claimed=False)
        return cls(state["stack_file"], run_dir=run_dir, environ=environ, run_id=state["run_id"],
                   journal=journal, spec=spec)


__all__ = ["ComposeStack", "build_image", "build_context_tar", "remove_project",
           "compose_command", "docker_client", "engine_available", "image_exists", "project_name",
           "resolved_compose", "LABEL_RUN", "LABEL_PROJECT", "LABEL_SERVICE", "PROJECT_PREFIX"]
