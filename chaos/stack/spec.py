"""The stack file: docker compose YAML plus kvchaos's ``x-kvchaos`` extension.

    compose YAML ─ load_yaml (lines) ─ resolve variables (free ports, run dir) ─ interpolate
        └─> StackFile (pydantic: services + KvchaosSettings) ─ checks across services
            (depends_on targets, cycles, x-kvchaos names) ─> StackSpec

Every problem is a :class:`~chaos.yamlsource.ConfigError` naming the file, the line and the
service, raised before any process or container starts. The compose keys kvchaos understands
are listed in docs/architecture.md section 1; compose keys that only the Docker backend uses are
accepted and ignored by LocalStack; anything else is an error (a typo must not be silently
ignored).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.prometheus import parse_selector
from chaos.stack.capabilities import CAPABILITIES, DERIVED, VARIABLE_PREFIX, variable_need
from chaos.stack.interpolate import InterpolationError, defaults_in, interpolate_data, variables_in
from chaos.yamlsource import (ConfigError, Locator, config_error_from_validation, foreign_file, format_path, kind_of,
                              load_yaml)

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*"
                       r"(?:(\d+(?:\.\d+)?)s)?\s*(?:(\d+(?:\.\d+)?)ms)?\s*"
                       r"(?:(\d+(?:\.\d+)?)us)?\s*$")


class StackError(RuntimeError):
    """A stack could not be brought up or driven (exit code 3: infrastructure error). Defined with
    the stack file (its port claims raise it); chaos/stack/base.py, where callers import it from,
    re-exports it.

    Attributes:
        service: the service concerned, or None.
        log_tail: the last lines of that service's log, when known.
        exited: the service's own process ended before it became healthy while no other
            process held its ports (it crashed or gave up; not a lost bind). A stack that
            never started is still an infrastructure error; a kill fault's timed restart that
            ends so is the service failing to come back under the scenario's faults
            (chaos/faults/kill.py).
    """

    def __init__(self, message: str, service: str | None = None, log_tail: str = "",
                 exited: bool = False) -> None:
        self.service = service
        self.log_tail = log_tail
        self.exited = exited
        text = message if not log_tail else f"{message}\n--- last log lines of {service} ---\n{log_tail}"
        super().__init__(text)


def parse_compose_duration(value: Any) -> float:
    """Seconds from a compose duration (``1m30s``, ``500ms``, ``2s``, ``1h``) or a number.

    Format from the Compose specification ("Specifying durations"): ``{value}{unit}`` with units
    us, ms, s, m, h, combinable. A bare number is seconds.

    Raises:
        ValueError: not a duration, or negative.
    """
    if isinstance(value, bool):
        raise ValueError("not a duration: a boolean (use e.g. 500ms, 2s, 1m30s)")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("negative duration")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("not a duration: expected a number of seconds or a text like 500ms, 2s, 1m30s")
    m = _DURATION.match(value)
    if not m or not any(m.groups()):
        raise ValueError("not a duration: expected a text like 500ms, 2s, 1m30s")
    h, mi, s, ms, us = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s + ms / 1e3 + us / 1e6


Seconds = float


def _check_selector(text: str, where: str = "") -> None:
    """:func:`chaos.prometheus.parse_selector` with a message that does not quote ``text`` (a
    stack file's values are never shown).

    Raises:
        ValueError: ``text`` is not a selector.
    """
    try:
        parse_selector(text)
    except ValueError:
        raise ValueError(f'{where}not a Prometheus selector (use name or name{{label="v"}}; matchers =, !=, '
                         "=~, !~ with a valid regex)") from None


class HealthCheck(BaseModel):
    """A compose ``healthcheck``. ``test`` is ``["CMD", argv...]``, ``["CMD-SHELL", "cmd"]``,
    ``["NONE"]`` or a string (= CMD-SHELL). Durations in seconds after validation."""

    model_config = ConfigDict(extra="forbid")
    test: list[str] | str
    interval: Seconds = 1.0
    timeout: Seconds = 5.0
    retries: int = Field(default=60, ge=0)
    start_period: Seconds = 0.0
    start_interval: Seconds | None = None
    disable: bool = False

    @field_validator("interval", "timeout", "start_period", "start_interval", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_compose_duration(v)

    @field_validator("test")
    @classmethod
    def _test_form(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("empty health check command")
            return v
        if not v:
            raise ValueError("empty health check test")
        if v[0] not in ("CMD", "CMD-SHELL", "NONE"):
            raise ValueError('test must start with "CMD", "CMD-SHELL" or "NONE"')
        if v[0] == "CMD" and len(v) < 2:
            raise ValueError('"CMD" needs a command after it')
        if v[0] == "CMD-SHELL" and (len(v) != 2 or not v[1].strip()):
            raise ValueError('"CMD-SHELL" takes exactly one shell command string')
        return v

    def argv(self) -> list[str] | None:
        """The probe as an argv list (CMD-SHELL/string through ``/bin/sh -c``); None for NONE."""
        t = self.test
        if isinstance(t, str):
            return ["/bin/sh", "-c", t]
        if t[0] == "NONE" or self.disable:
            return None
        if t[0] == "CMD-SHELL":
            return ["/bin/sh", "-c", t[1]]
        return list(t[1:])

    @property
    def deadline_s(self) -> float:
        """How long a start may take before the service counts as unhealthy (s):
        start_period + retries * (interval + timeout), as Docker's health state machine allows."""
        return self.start_period + max(self.retries, 1) * (self.interval + self.timeout)


class DependsOn(BaseModel):
    """A ``depends_on`` entry in map form."""

    model_config = ConfigDict(extra="forbid")
    condition: Literal["service_started", "service_healthy", "service_completed_successfully"] = "service_started"
    restart: bool = False
    required: bool = True


class Service(BaseModel):
    """One compose service. Keys LocalStack runs: command, environment, depends_on,
    healthcheck, working_dir, stop_signal, stop_grace_period. Keys only the compose backend
    uses are accepted. ``x-*`` extension keys are kept in :attr:`extensions`."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] | str | None = None
    environment: dict[str, str | int | float | bool | None] | list[str] = Field(default_factory=dict)
    depends_on: list[str] | dict[str, DependsOn] = Field(default_factory=list)
    healthcheck: HealthCheck | None = None
    working_dir: str | None = None
    stop_signal: str = "SIGTERM"
    stop_grace_period: Seconds = 10.0
    # Used by the compose backend only.
    image: str | None = None
    build: str | dict[str, Any] | None = None
    network_mode: str | None = None
    volumes: list[Any] | None = None
    tmpfs: list[str] | str | None = None
    restart: str | None = None
    container_name: str | None = None
    labels: dict[str, str] | list[str] | None = None
    entrypoint: list[str] | str | None = None
    user: str | None = None
    init: bool | None = None
    shm_size: str | int | None = None
    ipc: str | None = None
    ulimits: dict[str, Any] | None = None
    deploy: dict[str, Any] | None = None
    runtime: str | None = None
    cap_add: list[str] | None = None
    privileged: bool | None = None
    profiles: list[str] | None = None
    extensions: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _split_extensions(cls, data: Any) -> Any:
        if isinstance(data, dict):
            ext = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith("x-")}
            if ext:
                data = {k: v for k, v in data.items() if k not in ext}
                data["extensions"] = ext
        return data

    @field_validator("stop_grace_period", mode="before")
    @classmethod
    def _grace(cls, v: Any) -> Any:
        return parse_compose_duration(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str | None) -> list[str] | str | None:
        if v is not None and (not v or (isinstance(v, str) and not v.strip())):
            raise ValueError("empty command")
        return v

    def argv(self, backend: str = "local") -> list[str]:
        """The command as argv (a string is split like a shell would, without running one).

        Under the local backend, ``x-kvchaos-local: {command: ...}`` overrides ``command``: a
        service whose image has its own entrypoint (the real Toxiproxy) runs another program
        locally (``kvchaos proxy serve``)."""
        cmd = self.command
        if backend == "local":
            cmd = self.local_command() or cmd
        if cmd is None:
            return []
        return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]

    def local_command(self) -> list[str] | str | None:
        """``x-kvchaos-local.command``, if the service has one."""
        local = self.extensions.get("x-kvchaos-local")
        if isinstance(local, dict):
            return local.get("command")
        return None

    def env(self) -> dict[str, str]:
        """``environment`` as a str->str map (list form ``K=V``; booleans as true/false)."""
        if isinstance(self.environment, list):
            out = {}
            for item in self.environment:
                k, _, v = item.partition("=")
                out[k] = v if _ else os.environ.get(k, "")
            return out
        return {k: ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
                for k, v in self.environment.items()}

    def dependencies(self) -> dict[str, str]:
        """``{service: condition}``; the list form means ``service_started`` (compose semantics)."""
        if isinstance(self.depends_on, list):
            return {d: "service_started" for d in self.depends_on}
        return {d: c.condition for d, c in self.depends_on.items()}


class LinkEffect(BaseModel):
    """A counter of the system under test that grows when its link misbehaves (e.g. the
    engine's lookup timeouts for the engine->LMCache link): a Prometheus sample name at a
    ``/metrics`` URL. Network faults report its growth over their window as ``effects``."""

    model_config = ConfigDict(extra="forbid")
    url: str
    metric: str


class Link(BaseModel):
    """A TCP link through the fault proxy: clients connect to ``listen``, the proxy forwards to
    ``upstream`` (both ``host:port``); ``effects``: counters of the system under test on its
    path (:class:`LinkEffect`)."""

    model_config = ConfigDict(extra="forbid")
    listen: str
    upstream: str
    effects: list[LinkEffect] = Field(default_factory=list)

    @field_validator("listen", "upstream")
    @classmethod
    def _hostport(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("expected host:port (a port from 0 to 65535)")
        return v


class ProxySettings(BaseModel):
    """Where the stack's Toxiproxy (real or ``kvchaos proxy serve``) is."""

    model_config = ConfigDict(extra="forbid")
    service: str | None = None
    api: str


class RedisSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    service: str
    url: str


class LeakSource(BaseModel):
    """An HTTP endpoint whose counters must return to their baseline once the stack is quiet.

    ``format: json`` (the default): ``fields`` maps the reported name to a dotted path in the
    JSON the URL returns (``a.b.c``; list items by index, ``a.0.b``). ``format: prometheus``:
    the URL serves Prometheus text (``/metrics``) and ``fields`` maps the reported name to a
    series selector, ``metric`` or ``metric{label="v",other=~"re.*"}`` (matchers ``=``, ``!=``,
    ``=~``, ``!~`` as in PromQL; the matching series are summed; chaos/prometheus.py).

    ``baseline``: ``zero`` (every field must read 0) or ``before_faults`` (every field must
    come back to at most what it read when the run started, before any fault: gauges such as
    vLLM's ``vllm:kv_cache_usage_perc`` that an idle engine need not hold at 0)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    service: str | None = None
    format: Literal["json", "prometheus"] = "json"
    baseline: Literal["zero", "before_faults"] = "zero"
    fields: dict[str, str] = Field(min_length=1)

    @model_validator(mode="after")
    def _selectors(self) -> LeakSource:
        if self.format == "prometheus":
            for name, selector in self.fields.items():
                _check_selector(selector, f"fields.{name}: ")
        return self


class EngineMetrics(BaseModel):
    """Prometheus series of the engine's ``/metrics`` that faults and checks read, as
    selectors (``name`` or ``name{label="v"}``). Defaults are vLLM V1's names
    (``vllm/v1/metrics/loggers.py``); another engine's stack file gives its own (SGLang:
    ``sglang:num_retracted_requests_total``, ...)."""

    model_config = ConfigDict(extra="forbid")
    preemptions: str = Field(default="vllm:num_preemptions_total",
                             description="counter of preempted requests (recompute-style)")
    requests_running: str = Field(default="vllm:num_requests_running", description="gauge")
    requests_waiting: str = Field(default="vllm:num_requests_waiting", description="gauge")
    kv_cache_usage: str = Field(default="vllm:kv_cache_usage_perc", description="gauge, 0..1")
    prefix_cache_hits: str = Field(default="vllm:prefix_cache_hits_total",
                                   description="counter of tokens served by the engine's own prefix cache")
    external_prefix_cache_hits: str = Field(
        default="vllm:external_prefix_cache_hits_total",
        description="counter of tokens served by the KV connector (LMCache)")
    cache_config_info: str = Field(
        default="vllm:cache_config_info",
        description="info gauge of the engine's cache config; its block_size label is the tokens per "
                    "KV block (read by `kvchaos diagnose` when x-kvchaos.kv_layout gives no block_size)")

    @field_validator("*")
    @classmethod
    def _selector(cls, v: str) -> str:
        _check_selector(v)
        return v


class WitnessSettings(BaseModel):
    """A witness LMCache: one that only the recompute twin writes to (it stores, never loads),
    so its objects are the KV a clean twin computed; chaos/diagnose compares served KV with it."""

    model_config = ConfigDict(extra="forbid")
    service: str | None = None
    url: str = Field(description="the witness LMCache MP server's ZMQ address, tcp://HOST:PORT")
    http: str | None = Field(default=None, description="its HTTP API (status, objects)")


class KvLayout(BaseModel):
    """The engine's KV layout: its paged KV blocks and the objects LMCache stores from them, so
    that `kvchaos diagnose` can register a reader whose blocks LMCache fills the way it fills the
    engine's (LMCache picks its transfer format from the registered tensors' shape and the
    ``kv_layout`` hint, lmcache ``compute_kv_layout``; the object bytes are that format's).

    ``paged``:

    - ``kv_planes`` (the reference engine, vLLM's GPU FlashAttention): per layer ``[2,
      num_blocks, block_size, num_kv_heads, head_size]``, K and V planes, hint ``NHD`` (LMCache
      ``NL_X_TWO_NB_BS_NH_HS``); objects ``[2, num_layers, chunk_size, hidden_dim]``, the same
      whatever the engine's block size and head split.
    - ``cpu_attn`` (vLLM's CPU attention backend, ``vllm/v1/attention/backends/cpu_attn.py``):
      per layer ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (KV cache layout
      ``LBHNC``, hint ``HND``: LMCache ``NL_X_NB_NH_BS_CS``), which vLLM reads as ``[num_blocks,
      num_kv_heads, 2 * block_size, head_size]`` cut into K (first ``block_size`` rows, written
      dimension-major by its cache-write kernel) and V; objects ``[num_layers, chunk_size,
      num_kv_heads * 2 * head_size]`` whose rows are that block memory in order, so reading them
      back needs ``num_kv_heads`` and the engine's ``block_size``.
    """

    model_config = ConfigDict(extra="forbid")
    num_layers: int = Field(gt=0)
    hidden_dim: int = Field(gt=0, description="num_kv_heads * head_size")
    dtype: str = Field(default="float32", pattern=r"^(float32|float16|bfloat16)$")
    paged: Literal["kv_planes", "cpu_attn"] = Field(
        default="kv_planes", description="the engine's paged KV format (see the class docstring)")
    num_kv_heads: int | None = Field(default=None, gt=0, description="KV heads (needed by paged: cpu_attn)")
    block_size: int | None = Field(
        default=None, gt=0,
        description="the engine's tokens per KV block (paged: cpu_attn); default: the block_size label "
                    "of the engine's x-kvchaos.engine_metrics.cache_config_info series, read at diagnosis")

    @model_validator(mode="after")
    def _heads(self) -> KvLayout:
        if self.paged == "cpu_attn" and self.num_kv_heads is None:
            raise ValueError("paged: cpu_attn needs num_kv_heads")
        if self.num_kv_heads is not None and self.hidden_dim % self.num_kv_heads:
            raise ValueError(f"hidden_dim {self.hidden_dim} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self


class KvchaosSettings(BaseModel):
    """The ``x-kvchaos`` extension of a stack file (docs/architecture.md section 1)."""

    model_config = ConfigDict(extra="forbid")
    engine: str | None = None
    engine_url: str | None = None
    recompute: str | None = None
    recompute_url: str | None = None
    lmcache: str | None = None
    lmcache_http: str | None = None
    lmcache_url: str | None = Field(default=None, description="LMCache's own ZMQ address (not through the proxy)")
    witness: WitnessSettings | None = None
    kv_layout: KvLayout | None = Field(default=None, description="KV layout for diagnosis; default: "
                                       "from the engine's /debug/state config")
    proxy: ProxySettings | None = None
    links: dict[str, Link] = Field(default_factory=dict)
    l2_fs_path: str | None = None
    l2_fs_size: str | None = Field(
        default=None, pattern=r"^[0-9]+[kmg]?$",
        description="when set, the local backend mounts a tmpfs of this size (e.g. 64m) at l2_fs_path "
                    "before any service starts, so the disk_full fault can fill it (needs root)")
    redis: RedisSettings | None = None
    leak_sources: list[LeakSource] = Field(default_factory=list)
    chunk_size: int = Field(default=256, gt=0)
    capabilities: list[str] = Field(
        default_factory=list,
        description="what the stack's services offer beyond what the settings above imply, by "
                    "name from chaos/stack/capabilities.py (engine.hooks.preempt, engine.metrics, ...)")
    engine_metrics: EngineMetrics = Field(default_factory=EngineMetrics)
    planted_bugs: Literal["reference", "vllm"] = Field(
        default="reference",
        description="which planted-bug set the engine takes through KVCHAOS_ENGINE_BUGS (with the "
                    "engine.planted_bugs capability): reference (chaos/engine/bugs.py) or vllm "
                    "(wrappers of LMCache's vLLM connector, chaos/vllm/bugs.py)")

    @field_validator("capabilities")
    @classmethod
    def _known_capabilities(cls, v: list[str]) -> list[str]:
        # Only known names are quoted: the rest is the file's, and a stack file is never quoted.
        for i, name in enumerate(v):
            if name in DERIVED:
                raise ValueError(f"item {i}: {name!r} is not declared by hand: set x-kvchaos.{DERIVED[name]} instead")
            if name.startswith(VARIABLE_PREFIX):
                raise ValueError(f"item {i}: a {VARIABLE_PREFIX}... name: a variable is a capability when the "
                                 "file reads it (${NAME:-default}); do not list it")
            if name not in CAPABILITIES:
                raise ValueError(f"item {i}: unknown capability; known: "
                                 f"{', '.join(sorted(set(CAPABILITIES) - set(DERIVED)))}")
        return v


class StackFile(BaseModel):
    """A whole stack file."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    version: str | None = None
    name: str | None = None
    services: dict[str, Service]
    kvchaos: KvchaosSettings = Field(default_factory=KvchaosSettings, alias="x-kvchaos")
    networks: dict[str, Any] | None = None
    volumes: dict[str, Any] | None = None
    extensions: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _split_extensions(cls, data: Any) -> Any:
        if isinstance(data, dict):
            ext = {k: v for k, v in data.items()
                   if isinstance(k, str) and k.startswith("x-") and k != "x-kvchaos"}
            if ext:
                data = {k: v for k, v in data.items() if k not in ext}
                data["extensions"] = ext
        return data

    @field_validator("services")
    @classmethod
    def _some(cls, v: dict[str, Service]) -> dict[str, Service]:
        if not v:
            raise ValueError("a stack needs at least one service")
        return v


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``port`` on any address of the host (``127.0.0.2``,
    ``[::1]``, ... too) and ``host:port`` may be bound (chaos/stack/ports.py ``is_free``)."""
    from chaos.stack.ports import is_free

    return is_free(port, host)


def free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A TCP port the kernel says is free now (bind to port 0), not in ``avoid``, on which
    nothing listens on any address (:func:`port_is_free`)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if (not avoid or port not in avoid) and port_is_free(port, host):
            return port
    raise OSError("could not find a free port")


def resolve_variables(raw: Any, *, environ: dict[str, str] | None = None,
                      run_dir: Path | None = None, allocate_ports: bool = True,
                      refuse_claimed: bool = True) -> dict[str, str]:
    """The variables a stack file is interpolated with.

    Starts from ``environ`` (``os.environ`` when None). Every variable named ``*_PORT`` that has
    a literal default in the file (``${X_PORT:-1234}``) and is not set gets its default when that
    port is free (nothing listens on it on any address, :func:`port_is_free`), else a free port
    picked below the ephemeral range (``allocate_ports``), so every reference to it resolves to
    the same port; chosen ports are claimed host-wide for the stack (chaos/stack/ports.py: owner
    ``run_dir``) so a concurrent kvchaos stack, of any state dir or user, does not pick them too.
    A ``*_PORT`` variable the file reads that ``environ`` sets (the user's choice, or the ports
    of this stack resolved before) is claimed for the stack too (``allocate_ports``); when
    another kvchaos stack holds that claim, the stack must not start (``refuse_claimed``; False:
    the ports are known to be this stack's own, as for a stack that ``kvchaos stack up`` left
    running: claimed where nobody holds them, never refused). ``KVCHAOS_RUN_DIR`` is set to
    ``run_dir`` and ``KVCHAOS_SOCKET_DIR`` to :func:`socket_dir` of it.

    Returns:
        The variables (a new dict).

    Raises:
        StackError: a set ``*_PORT`` variable names a port another kvchaos stack claims; the
            message names the variable, the port and the claim's holder (pid, owner).
        OSError: no free port could be claimed, or the claims folder is not writable.
    """
    env = dict(os.environ if environ is None else environ)
    if run_dir is not None:
        env["KVCHAOS_RUN_DIR"] = str(run_dir)
        env["KVCHAOS_SOCKET_DIR"] = str(socket_dir(run_dir))
    if not allocate_ports:
        for name, default in defaults_in(raw).items():
            if name.endswith("_PORT") and not env.get(name):
                env[name] = str(int(default) if default.isdigit() else 0)
        return env
    from chaos.stack.ports import claim, owned, pick_port, release

    owner = port_owner(run_dir)
    before = set(owned(owner))
    try:
        # The ports set already are not picked again for another variable.
        taken = _claim_set_ports(raw, env, owner, refuse_claimed)
        for name, default in defaults_in(raw).items():
            if not name.endswith("_PORT") or env.get(name):
                continue
            port = int(default) if default.isdigit() else 0
            # Claimed across kvchaos processes: a port bound only later (a proxy link) is not
            # picked by two stacks starting at once. Claim first, then check it is free.
            if port == 0 or port in taken or not claim(port, owner):
                port = pick_port(owner, avoid=taken)
            elif not port_is_free(port):
                release([port], owner)
                port = pick_port(owner, avoid=taken)
            taken.add(port)
            env[name] = str(port)
    except BaseException:  # no stack will hold what this call claimed
        release(sorted(set(owned(owner)) - before), owner)
        raise
    return env


def _claim_set_ports(raw: Any, env: dict[str, str], owner: str | None, refuse: bool) -> set[int]:
    """Claim for ``owner`` every ``*_PORT`` variable the stack file reads that ``env`` sets.

    Returns:
        The ports of those variables.

    Raises:
        StackError: (``refuse``) another kvchaos stack (another process, or another stack of this
            one) claims one of them.
    """
    from chaos.stack.ports import claim, holder

    ports: set[int] = set()
    for name in sorted(variables_in(raw)):
        value = env.get(name, "")
        if not name.endswith("_PORT") or not value.strip().isdigit() or not 0 < int(value) < 65536:
            continue
        port = int(value)
        ports.add(port)
        if claim(port, owner) or not refuse:
            continue
        raise StackError(f"{name}={port}: port {port} is claimed by another kvchaos stack "
                         f"({holder(port) or 'a claim that just ended'}); it would take the port from "
                         f"that stack, or lose it: unset {name} (a free port is picked) or choose another")
    return ports


#: The longest path a Unix socket may have: ``sun_path`` is 108 bytes with its terminating NUL
#: (Linux, man 7 unix).
SUN_PATH_MAX = 107


def socket_dir(run_dir: Path) -> Path:
    """The stack's folder for Unix sockets (``${KVCHAOS_SOCKET_DIR}``): short, so a socket name
    under it fits ``sun_path`` however deep ``run_dir`` is, e.g. vLLM's ZeroMQ IPC sockets,
    ``<VLLM_RPC_BASE_PATH>/<uuid4>`` (vllm/utils/network_utils.py ``get_open_zmq_ipc_path``),
    which vLLM leaves behind when it is killed. Not created here (the service that binds there
    creates it); the local backend removes it at ``down``.

    Returns:
        ``<tempdir>/kvchaos-sock-<12 hex digits of the resolved run_dir's sha1>`` (e.g. 30
        characters under /tmp: 31 more for a socket name leaves room for a uuid4).
    """
    import hashlib
    import tempfile

    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"kvchaos-sock-{digest}"


def port_owner(run_dir: Path | None) -> str | None:
    """The owner name of a stack's port claims (chaos/stack/ports.py): its run dir, or None
    (this process) for a stack without one."""
    return None if run_dir is None else f"stack:{Path(run_dir).resolve()}"


class StackSpec:
    """A validated, interpolated stack file.

    Attributes:
        path: the stack file.
        file: the validated :class:`StackFile`.
        env: the variables it was interpolated with (ports chosen, run dir).
        locator: line numbers of the raw file.
        settings: ``file.kvchaos``.
    """

    def __init__(self, path: Path, file: StackFile, env: dict[str, str], locator: Locator,
                 variables_read: set[str] | None = None) -> None:
        self.path = path
        self.file = file
        self.env = env
        self.locator = locator
        self.settings = file.kvchaos
        self.variables_read = set(variables_read or ())

    def capabilities(self) -> set[str]:
        """What this stack offers (chaos/stack/capabilities.py): ``x-kvchaos.capabilities``,
        the capabilities other ``x-kvchaos`` settings imply (``lmcache_http`` ->
        ``lmcache.http``, ...), and ``var:NAME`` for every variable the file reads."""
        s = self.settings
        have = set(s.capabilities)
        have.update(cap for cap, key in DERIVED.items() if getattr(s, key))
        have.update(variable_need(v) for v in self.variables_read)
        return have

    @property
    def services(self) -> dict[str, Service]:
        return self.file.services

    def line_of(self, *path: str | int) -> int | None:
        """Line of a data path in the stack file (for error messages)."""
        return self.locator.line_of(path)

    def service_error(self, service: str, message: str, *path: str | int) -> ConfigError:
        """A ConfigError naming the file, the service's line (or a key under it) and the service."""
        full = ("services", service) + tuple(path)
        return ConfigError(str(self.path), self.locator.line_of(full), format_path(full), message)

    def with_dependencies(self, services: list[str]) -> list[str]:
        """``services`` plus everything they depend on, transitively.

        Raises:
            ConfigError: a name is not a service of the stack file.
        """
        out: set[str] = set()
        todo = list(services)
        while todo:
            n = todo.pop()
            if n not in self.services:
                raise ConfigError(str(self.path), None, None,
                                  f"unknown service {n!r} (services: {', '.join(self.services)})")
            if n not in out:
                out.add(n)
                todo.extend(self.services[n].dependencies())
        return [n for n in self.services if n in out]

    def start_order(self) -> list[list[str]]:
        """Services in dependency order, as waves that may start together."""
        deps = {n: set(s.dependencies()) for n, s in self.services.items()}
        waves: list[list[str]] = []
        done: set[str] = set()
        while len(done) < len(deps):
            wave = sorted(n for n, d in deps.items() if n not in done and d <= done)
            if not wave:  # validated acyclic in load_stack
                raise RuntimeError("dependency cycle")
            waves.append(wave)
            done.update(wave)
        return waves


def load_stack(path: str | Path, *, environ: dict[str, str] | None = None,
               run_dir: Path | None = None, require_commands: bool = True,
               allocate_ports: bool = True, refuse_claimed: bool = True) -> StackSpec:
    """Load, interpolate and validate a stack file.

    Args:
        path: the compose-format stack file.
        environ: variables (``os.environ`` when None); unset ``*_PORT`` ones are allocated.
        run_dir: the stack's scratch folder (``${KVCHAOS_RUN_DIR}``).
        require_commands: every service must have a ``command`` (LocalStack runs it).
        allocate_ports: pick free ports for taken defaults and claim every port (False: keep
            defaults and claim nothing, e.g. for ``kvchaos validate``).
        refuse_claimed: a ``*_PORT`` variable set in ``environ`` whose port another kvchaos
            stack claims is a StackError (False: the ports are this stack's own, e.g. a stack
            re-attached from its state; see :func:`resolve_variables`).

    Returns:
        The :class:`StackSpec`.

    Raises:
        ConfigError: unreadable file, bad YAML, unknown key, bad value, a missing variable,
            unknown ``depends_on`` target, a dependency cycle, a missing command, or an
            ``x-kvchaos`` entry naming a service that does not exist. The message names the
            file and line, and the service where there is one.
        StackError: a set ``*_PORT`` variable names a port another kvchaos stack claims.
        OSError: no free port could be claimed (chaos/stack/ports.py ``pick_port``).

    No error quotes a value of the file (only keys, lines and what was expected), since a
    scenario's ``stack:`` may name any file on the host.
    """
    with foreign_file():  # nothing of the file is quoted: a scenario's `stack:` may name any file
        return _load_stack(Path(path), environ=environ, run_dir=run_dir, require_commands=require_commands,
                           allocate_ports=allocate_ports, refuse_claimed=refuse_claimed)


def _load_stack(path: Path, *, environ: dict[str, str] | None, run_dir: Path | None, require_commands: bool,
                allocate_ports: bool, refuse_claimed: bool) -> StackSpec:
    name = str(path)
    raw, locator = load_yaml(path)
    if not isinstance(raw, dict) or "services" not in raw:
        # Said without quoting the file: a scenario's `stack:` may name any file on the host.
        found = "a mapping without `services:`" if isinstance(raw, dict) else kind_of(raw)
        raise ConfigError(name, locator.line_of(()), None, "not a stack file: expected a compose-format "
                          f"mapping with `services:` (and `x-kvchaos:`), found {found}")
    env = resolve_variables(raw, environ=environ, run_dir=run_dir, allocate_ports=allocate_ports,
                            refuse_claimed=refuse_claimed)
    problems: list[ConfigError] = []

    def bad_var(p: tuple, exc: InterpolationError) -> None:
        problems.append(ConfigError(name, locator.line_of(p), format_path(p), exc.unquoted))

    data = interpolate_data(raw, env, on_error=bad_var)
    if problems:
        raise problems[0]
    try:
        file = StackFile.model_validate(data)
    except pydantic.ValidationError as exc:
        # Key and expected type only: a scenario's `stack:` may name any file on the host.
        raise config_error_from_validation(name, exc, locator, data, quote_values=False) from None
    spec = StackSpec(path, file, env, locator, variables_read=variables_in(raw))

    for svc_name, svc in file.services.items():
        for dep in svc.dependencies():
            if dep not in file.services:
                raise spec.service_error(svc_name, f"service {svc_name!r} depends on a service the file does not define",
                                         "depends_on")
            if dep == svc_name:
                raise spec.service_error(svc_name, f"service {svc_name!r} depends on itself", "depends_on")
        local = svc.extensions.get("x-kvchaos-local")
        if local is not None and (not isinstance(local, dict) or set(local) - {"command"}
                                  or not isinstance(local.get("command"), (str, list)) or not local.get("command")):
            raise spec.service_error(svc_name, "x-kvchaos-local takes one key, command (a list or a string)",
                                     "x-kvchaos-local")
        if require_commands and svc.command is None and svc.local_command() is None:
            raise spec.service_error(svc_name, f"service {svc_name!r} has no command "
                                     "(the local backend runs each service's command)")
        if svc.dependencies() and any(c == "service_healthy" for c in svc.dependencies().values()):
            for dep, cond in svc.dependencies().items():
                if cond == "service_healthy" and file.services[dep].healthcheck is None:
                    raise spec.service_error(svc_name, f"service {svc_name!r} waits for {dep!r} to be healthy, "
                                             f"but {dep!r} has no healthcheck", "depends_on", dep)
    _check_cycles(spec)
    _check_settings(spec)
    return spec


def _check_cycles(spec: StackSpec) -> None:
    state: dict[str, int] = {}

    def visit(n: str, trail: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cycle = " -> ".join(trail[trail.index(n):] + [n])
            raise spec.service_error(n, f"dependency cycle: {cycle}", "depends_on")
        state[n] = 1
        for d in spec.services[n].dependencies():
            visit(d, trail + [n])
        state[n] = 2

    for n in spec.services:
        visit(n, [])


def _check_settings(spec: StackSpec) -> None:
    s = spec.settings
    for key in ("engine", "recompute", "lmcache"):
        svc = getattr(s, key)
        if svc is not None and svc not in spec.services:
            raise ConfigError(str(spec.path), spec.locator.line_of(("x-kvchaos", key)), f"x-kvchaos.{key}",
                              f"names a service the file does not define (services: {', '.join(spec.services)})")
    for key, obj in (("proxy", s.proxy), ("redis", s.redis), ("witness", s.witness)):
        if obj is not None and obj.service is not None and obj.service not in spec.services:
            raise ConfigError(str(spec.path), spec.locator.line_of(("x-kvchaos", key, "service")),
                              f"x-kvchaos.{key}.service", "names a service the file does not define")
    for i, src in enumerate(s.leak_sources):
        if src.service is not None and src.service not in spec.services:
            raise ConfigError(str(spec.path), spec.locator.line_of(("x-kvchaos", "leak_sources", i, "service")),
                              f"x-kvchaos.leak_sources[{i}].service", "names a service the file does not define")
    if s.links and s.proxy is None:
        raise ConfigError(str(spec.path), spec.locator.line_of(("x-kvchaos", "links")), "x-kvchaos.links",
                          "links need a proxy: add x-kvchaos.proxy.api")
