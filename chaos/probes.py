"""Trigger probes: what a scenario must see while a fault (or a phase) is in place to count.

A fault "acted" when its own evidence says so (a toxic delayed bytes, objects were deleted); that
does not say the failure window the scenario is about was reached (a read failed after the
delete, a request held its lookup when it was cancelled). A *trigger* is one or more conditions
read from the stack's own endpoints and logs, evaluated generically by the runner:

    apply ──> baseline of each condition ──> samples every SAMPLE_EVERY_S while in place ──> final
              (before the fault acts)          (a gauge's max, a counter's increase)        at heal
                                                                                 (before heal)
    condition (one of):
      metric: NAME  {labels}  a Prometheus sample of a service's /metrics (summed over the
                              label sets that match ``labels``; a list of names: summed over
                              them)                                  grew_by: N | reached: N
      json: a.b.0.c           a number at a dotted path of a service's JSON endpoint (``url``)
                                                                     grew_by: N | reached: N
      log: REGEX              lines of the service's log that match (colour codes removed),
                              written while in place                 matched: N (default 1)

``grew_by`` is a counter's increase as Prometheus' ``increase()`` counts it (a value lower than
the one before is a restart: counting goes on from 0); ``reached`` is the highest value seen.
A service is named by its stack role (``engine``, ``recompute``, ``lmcache``, ``redis``,
``proxy``: the services the stack's ``x-kvchaos`` names for them) or by its compose name, so one
scenario reads the same on every stack. ``url`` is a path joined to the service's HTTP address
from ``x-kvchaos`` (``/status``), or an absolute URL that may use the stack's ``${VARS}``.

``only_with: CAPABILITY`` (a name of chaos/stack/capabilities.py) watches a condition only on
stacks that offer that capability (the reference engine's ``kvchaos_engine_*`` counters next to
a portable log line of LMCache's client adapter): elsewhere it is reported "not applicable on
this stack", never counted as reached, and needs nothing. A trigger is reached when every
applicable condition is; a trigger none of whose conditions applies is never reached (the run
is inconclusive, and validation against such a stack refuses it).

A probe that cannot be read counts as "not seen", never as seen: an unreachable endpoint makes
a trigger unreached (the run inconclusive), never a false pass.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.httppool import pool_limits, ssl_context
from chaos.prometheus import text_samples

__all__ = ["Condition", "Trigger", "Triggered", "TriggerSpec", "trigger_field", "reason_field", "NO_TRIGGER", "conditions_of", "check_no_trigger_reason", "TriggerWatch", "ProbeError", "ROLES", "resolve_service",
           "http_base", "read_json_number", "read_metric", "LogCursor", "json_at",
           "trigger_problems", "stack_capabilities", "SAMPLE_EVERY_S"]

#: Seconds between samples of a trigger's numbers while its fault is in place.
SAMPLE_EVERY_S = 0.2
#: HTTP timeout of one probe read, seconds.
READ_TIMEOUT_S = 5.0

#: Terminal colour codes (LMCache colours its log lines); removed before a line is matched.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Stack roles a probe may name instead of a compose service (keys of ``x-kvchaos``).
ROLES = ("engine", "recompute", "lmcache", "redis", "proxy")


class ProbeError(RuntimeError):
    """A probe could not be read (endpoint down, not JSON, path missing, not a number)."""


class Condition(BaseModel):
    """One trigger condition: a metric, a JSON number or a log line of a service, and what it
    must do while the fault is in place. (``json`` in YAML is ``json_path`` in Python.)"""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    metric: str | list[str] | None = Field(
        default=None, min_length=1,
        description="a Prometheus sample name on the service's /metrics, e.g. "
        "lmcache_mp_l2_prefetch_failure_chunks_total, or a list of names whose samples are summed")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="only samples with these label values count (metric)")
    json_path: str | None = Field(default=None, alias="json", min_length=1,
                                  description="a dotted path to a number in the JSON that `url` answers, "
                                  "e.g. storage_manager.l1_manager.read_locked_count")
    log: str | None = Field(default=None, min_length=1,
                            description="a regular expression (Python re) matched against each new line "
                            "of the service's log")
    service: str = Field(min_length=1, description="the service: a stack role (engine, recompute, lmcache, "
                         "redis, proxy) or a compose service name")
    url: str | None = Field(default=None, min_length=1,
                            description="the endpoint: a path joined to the service's HTTP address "
                            "(/status) or an absolute URL (may use ${VARS}); metric default /metrics")
    grew_by: float | None = Field(default=None, gt=0, description="the counter grew by at least this "
                                  "much while in place (metric, json)")
    reached: float | None = Field(default=None, description="the highest value seen while in place was "
                                  "at least this (metric, json: a gauge)")
    matched: int | None = Field(default=None, ge=1, description="at least this many new log lines "
                                "matched (log; default 1)")
    only_with: str | None = Field(default=None, min_length=1,
                                  description="watch this condition only on stacks that offer this "
                                  "capability (chaos/stack/capabilities.py, e.g. engine.kvchaos_metrics); "
                                  "elsewhere it is reported not applicable and needs nothing")

    @model_validator(mode="after")
    def _one_probe(self) -> Condition:
        probes = [n for n, v in (("metric", self.metric), ("json", self.json_path), ("log", self.log))
                  if v is not None]
        if len(probes) != 1:
            raise ValueError("give exactly one of `metric`, `json` or `log`" if not probes
                             else f"give one of `metric`, `json` or `log`, not {' and '.join(probes)}")
        if self.log is not None:
            if self.grew_by is not None or self.reached is not None:
                raise ValueError("a `log` condition counts matching lines: use `matched: N`, "
                                 "not grew_by/reached")
            try:
                re.compile(self.log)
            except re.error as exc:
                raise ValueError(f"log: not a regular expression ({exc})") from None
            if self.url is not None:
                raise ValueError("a `log` condition reads the service's log; `url` does not apply")
        else:
            if self.matched is not None:
                raise ValueError("`matched` is for `log` conditions; use grew_by or reached")
            if (self.grew_by is None) == (self.reached is None):
                raise ValueError("give exactly one of `grew_by: N` (a counter) or `reached: N` (a gauge)")
            if self.json_path is not None and self.url is None:
                raise ValueError("a `json` condition needs `url` (e.g. /status)")
        if self.labels and self.metric is None:
            raise ValueError("`labels` is for `metric` conditions")
        if self.only_with is not None:
            from chaos.stack.capabilities import CAPABILITIES, is_known

            if not is_known(self.only_with):
                raise ValueError(f"only_with: unknown capability {self.only_with!r}; known: "
                                 + ", ".join(sorted(CAPABILITIES)) + ", var:NAME")
        return self

    def applies(self, capabilities: set[str] | None) -> bool:
        """True when this condition is watched on a stack offering ``capabilities`` (always
        without ``only_with``; never when the stack's capabilities are unknown)."""
        return self.only_with is None or (capabilities is not None and self.only_with in capabilities)

    @property
    def metric_names(self) -> list[str]:
        """The metric names summed (one or several)."""
        m = self.metric
        return [] if m is None else [m] if isinstance(m, str) else list(m)

    @property
    def probe(self) -> Literal["metric", "json", "log"]:
        """Which kind of probe this is."""
        return "metric" if self.metric is not None else "json" if self.json_path is not None else "log"

    def describe(self) -> str:
        """One line for reports, e.g. ``lmcache metric x{reason=not_found} grew by >= 1``
        (with `` [only with CAP]`` for an ``only_with`` condition)."""
        only = f" [only with {self.only_with}]" if self.only_with else ""
        return self._describe() + only

    def _describe(self) -> str:
        if self.probe == "log":
            return f"{self.service} log /{self.log}/ matched >= {self.matched or 1} line(s)"
        if self.probe == "metric":
            labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
            what = f"{self.service} metric {'+'.join(self.metric_names)}" + (f"{{{labels}}}" if labels else "")
        else:
            what = f"{self.service} {self.url} {self.json_path}"
        return what + (f" grew by >= {self.grew_by:g}" if self.grew_by is not None
                       else f" reached >= {self.reached:g}")


def _as_list(v: Any) -> Any:
    return [v] if isinstance(v, dict) else v


#: What a fault's or a phase's ``trigger:`` holds: one condition or a list (all must be seen).
Trigger = list[Condition]


#: ``trigger: none``: the author says no trigger proves this window (with a ``reason``); a run
#: whose checks pass is then "passed (window not proven)", never plain passed.
NO_TRIGGER = "none"


def normalize_trigger(v: Any) -> Any:
    """``trigger: {...}`` (one condition) is the same as ``trigger: [{...}]``; ``trigger: none``
    stays the string ``"none"`` (:data:`NO_TRIGGER`)."""
    return v if v == NO_TRIGGER else _as_list(v)


def conditions_of(trigger: list[Condition] | str | None) -> list[Condition]:
    """The conditions of a ``trigger`` field: ``[]`` for ``none`` or nothing."""
    return [] if trigger is None or isinstance(trigger, str) else list(trigger)


def check_no_trigger_reason(trigger: list[Condition] | str, reason: str | None) -> None:
    """``trigger: none`` needs a ``reason``, and ``reason`` is only for ``trigger: none``.

    Raises:
        ValueError: one without the other.
    """
    if trigger == NO_TRIGGER and not (reason or "").strip():
        raise ValueError("`trigger: none` needs a `reason`: say why nothing can prove this window (the run "
                         "is then 'passed (window not proven)' at best)")
    if trigger != NO_TRIGGER and reason is not None:
        raise ValueError("`reason` is for `trigger: none` (why no trigger proves the window); drop it or "
                         "say `trigger: none`")


#: The type of a ``trigger`` field: one condition or a list (normalized by :class:`Triggered`),
#: or :data:`NO_TRIGGER`.
TriggerSpec = list[Condition] | Literal["none"]


def trigger_field(description: str) -> Any:
    """The ``trigger`` field of a :class:`Triggered` model (empty by default: the kind's default)."""
    return Field(default_factory=list, description=description)


def reason_field(description: str) -> Any:
    """The ``reason`` field of a :class:`Triggered` model (only with ``trigger: none``)."""
    return Field(default=None, min_length=1, description=description)


class Triggered(BaseModel):
    """What a model with a ``trigger`` and a ``reason`` field shares (a fault's parameters, a
    phase): one condition or a list, ``trigger: none`` only with a ``reason``, and the
    properties the runner and ``validate`` read. The fields themselves (with their own
    descriptions) are the subclass's."""

    @field_validator("trigger", mode="before", check_fields=False)
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return normalize_trigger(v)

    @model_validator(mode="after")
    def _none_needs_reason(self) -> "Triggered":
        check_no_trigger_reason(self.trigger, self.reason)  # type: ignore[attr-defined]
        return self

    @property
    def conditions(self) -> list[Condition]:
        """The declared trigger's conditions (``[]``: none declared, or ``trigger: none``)."""
        return conditions_of(self.trigger)  # type: ignore[attr-defined]

    @property
    def window_unproven(self) -> bool:
        """``trigger: none``: the author says nothing proves this window."""
        return self.trigger == NO_TRIGGER  # type: ignore[attr-defined]


# --- the stack side ----------------------------------------------------------------------
def resolve_service(name: str, settings: Any, services: Any = None) -> str:
    """The compose service a probe's ``service`` names.

    Args:
        name: a role in ROLES or a compose service name.
        settings: the stack's ``x-kvchaos`` settings (chaos/stack/spec.py KvchaosSettings).
        services: the stack's service names (None: not checked).

    Raises:
        ValueError: neither a role the stack fills nor one of its services.
    """
    if name in ROLES:
        role = _role_service(name, settings)
        if role is not None:
            return role
    if services is None or name in services:
        return name
    have = ", ".join(sorted(set(services) | {r for r in ROLES if _role_service(r, settings)})) or "none"
    raise ValueError(f"unknown service {name!r}; the stack has: {have}")


def _role_service(role: str, settings: Any) -> str | None:
    if role in ("proxy", "redis"):
        sub = getattr(settings, role, None)
        return getattr(sub, "service", None) if sub is not None else None
    return getattr(settings, role, None)


def http_base(service: str, settings: Any) -> str | None:
    """The HTTP address ``x-kvchaos`` gives ``service`` (engine_url, recompute_url,
    lmcache_http, proxy.api); None when it gives none."""
    pairs = [(settings.engine, settings.engine_url), (settings.recompute, settings.recompute_url),
             (settings.lmcache, settings.lmcache_http),
             (settings.proxy.service if settings.proxy else None, settings.proxy.api if settings.proxy else None)]
    for svc, url in pairs:
        if svc is not None and svc == service and url:
            return url.rstrip("/")
    return None


def probe_url(cond: Condition, settings: Any, env: dict[str, str]) -> str:
    """The absolute URL a metric/json condition reads.

    Raises:
        ValueError: a relative ``url`` on a service with no HTTP address in ``x-kvchaos``.
    """
    from chaos.stack.interpolate import interpolate

    url = cond.url or "/metrics"
    if url.startswith("/"):
        service = resolve_service(cond.service, settings)
        base = http_base(service, settings)
        if base is None:
            raise ValueError(f"service {cond.service!r} has no HTTP address in the stack's x-kvchaos "
                             f"(engine_url, recompute_url, lmcache_http, proxy.api): give `url` as an "
                             "absolute URL, e.g. http://127.0.0.1:${PORT_VAR}" + url)
        return base + url
    return interpolate(url, env)


def trigger_problems(conditions: list[Condition], settings: Any, services: Any,
                     capabilities: set[str] | None = None) -> list[tuple[tuple, str]]:
    """What is wrong with ``conditions`` on this stack, as ``[(path within the trigger, message)]``
    (empty: nothing): unknown services, relative URLs of services without an HTTP address. With
    ``capabilities``, a condition that does not apply there (``only_with``) is not checked."""
    out: list[tuple[tuple, str]] = []
    for i, cond in enumerate(conditions):
        if capabilities is not None and not cond.applies(capabilities):
            continue
        try:
            resolve_service(cond.service, settings, services)
        except ValueError as exc:
            out.append(((i, "service"), str(exc)))
            continue
        if cond.probe != "log":
            try:
                probe_url(cond, settings, {})
            except ValueError as exc:
                out.append(((i, "url"), str(exc)))
    return out


# --- readers -----------------------------------------------------------------------------
def json_at(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` (``a.b.0.c``; list items by index).

    Raises:
        KeyError: a step of the path is missing.
    """
    cur = data
    for part in path.split("."):
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError):
                raise KeyError(f"{path}: no item {part!r}") from None
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(f"{path}: no key {part!r}")
    return cur


def read_json_number(url: str, path: str, client: httpx.Client | None = None,
                     timeout_s: float = READ_TIMEOUT_S) -> float:
    """The number at dotted ``path`` of the JSON that ``GET url`` answers.

    Raises:
        ProbeError: no 2xx answer, not JSON, the path is missing, or not a number.
    """
    try:
        r = (client or httpx).get(url, timeout=timeout_s)
        r.raise_for_status()
        value = json_at(r.json(), path)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise ProbeError(f"{url}: {type(exc).__name__}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProbeError(f"{url}: {path} is {value!r}, not a number")
    return float(value)


def read_metric(url: str, name: str | list[str], labels: dict[str, str] | None = None,
                client: httpx.Client | None = None) -> tuple[float, bool]:
    """The sum of Prometheus samples ``name`` (or of any of several names), matching ``labels``,
    at ``url``.

    Returns:
        ``(value, seen)``: ``seen`` False when no sample of that name matched, then value 0
        (LMCache's OpenTelemetry counters appear only on their first increment).

    Raises:
        ProbeError: no 2xx answer or not Prometheus text.
    """
    try:
        r = (client or httpx).get(url, timeout=READ_TIMEOUT_S)
        r.raise_for_status()
        samples = text_samples(r.text)
    except (httpx.HTTPError, ValueError) as exc:
        raise ProbeError(f"{url}: {type(exc).__name__}: {exc}") from None
    names = {name} if isinstance(name, str) else set(name)
    total, seen = 0.0, False
    for s_name, s_labels, value in samples:
        if s_name not in names or any(s_labels.get(k) != v for k, v in (labels or {}).items()):
            continue
        total += value
        seen = True
    return total, seen


class LogCursor:
    """New lines of a service's log since :meth:`mark`.

    LocalStack writes ``<run_dir>/logs/<service>.log`` (appended across restarts); the compose
    backend reads the container's log (``docker logs --since``).
    """

    def __init__(self, stack: Any, service: str) -> None:
        self.stack = stack
        self.service = service
        self._offset = 0
        self._since: float | None = None

    def _file(self) -> Path | None:
        log_dir = getattr(self.stack, "log_dir", None)
        if getattr(self.stack, "backend", "local") == "compose" or log_dir is None:
            return None
        return Path(log_dir) / f"{self.service}.log"

    def mark(self) -> None:
        """Remember where the log ends now."""
        path = self._file()
        if path is not None:
            try:
                self._offset = path.stat().st_size
            except FileNotFoundError:
                self._offset = 0
        else:
            self._since = time.time()

    def new_text(self) -> str:
        """The log written since :meth:`mark` (all of it when the file got shorter: replaced).

        Raises:
            ProbeError: the log cannot be read.
        """
        path = self._file()
        if path is not None:
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, 2)
                    f.seek(self._offset if size >= self._offset else 0)
                    return f.read().decode("utf-8", "replace")
            except FileNotFoundError:
                return ""
            except OSError as exc:
                raise ProbeError(f"log of {self.service}: {exc}") from None
        try:
            container = self.stack.container(self.service)
            since = int(self._since or 0)
            return container.logs(stdout=True, stderr=True, since=since).decode("utf-8", "replace")
        except Exception as exc:  # docker SDK errors, a removed container
            raise ProbeError(f"log of {self.service}: {type(exc).__name__}: {exc}") from None


# --- watching a trigger --------------------------------------------------------------------
class _Probe:
    """One condition being watched: its readings so far."""

    def __init__(self, cond: Condition, stack: Any, applicable: bool = True) -> None:
        self.cond = cond
        self.stack = stack
        self.applicable = applicable
        self.url: str | None = None
        self.service = cond.service
        self.baseline: float | None = None
        self.last: float | None = None
        self.max: float | None = None
        self.increase = 0.0
        self.samples = 0
        self.seen = False
        self.errors: list[str] = []
        self.matched = 0
        self.lines: list[str] = []
        self.cursor: LogCursor | None = None
        if not applicable:
            return
        try:
            self.service = resolve_service(cond.service, stack.settings)
            if cond.probe == "log":
                self.cursor = LogCursor(stack, self.service)
            else:
                self.url = probe_url(cond, stack.settings, dict(getattr(stack, "env", None) or {}))
        except Exception as exc:  # no stack, an unknown service: not seen, and said so
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _read(self, client: httpx.Client) -> float:
        assert self.url is not None
        if self.cond.probe == "metric":
            value, seen = read_metric(self.url, self.cond.metric_names, self.cond.labels, client)
            self.seen = self.seen or seen
            return value
        self.seen = True
        return read_json_number(self.url, self.cond.json_path or "", client)

    def begin(self, client: httpx.Client) -> None:
        if self.cursor is not None:
            self.cursor.mark()
            return
        if self.url is None:
            return
        try:
            self.baseline = self.last = self._read(client)
        except ProbeError as exc:
            self.errors.append(f"baseline: {exc}")

    def sample(self, client: httpx.Client) -> None:
        if self.url is None:
            return
        try:
            value = self._read(client)
        except ProbeError as exc:
            if len(self.errors) < 20:
                self.errors.append(str(exc))
            return
        self.samples += 1
        self.max = value if self.max is None else max(self.max, value)
        if self.last is None:
            # No baseline (the endpoint was down at apply): this first reading is the reference,
            # so the increase can only be under-counted, never made up.
            self.last = value
            if self.baseline is None:
                self.baseline = value
            return
        # Prometheus increase(): a drop is a counter reset, counting goes on from 0.
        self.increase += value - self.last if value >= self.last else value
        self.last = value

    def finish(self) -> None:
        if self.cursor is None:
            return
        try:
            text = self.cursor.new_text()
        except ProbeError as exc:
            self.errors.append(str(exc))
            return
        rx = re.compile(self.cond.log or "")
        hits = [line for line in (_ANSI.sub("", ln) for ln in text.splitlines()) if rx.search(line)]
        self.matched = len(hits)
        self.lines = [h[:240] for h in hits[:3]]

    def reached(self) -> bool:
        c = self.cond
        if c.probe == "log":
            return self.matched >= (c.matched or 1)
        if c.grew_by is not None:
            return self.samples > 0 and self.increase >= c.grew_by
        return self.max is not None and c.reached is not None and self.max >= c.reached

    def result(self) -> dict[str, Any]:
        c = self.cond
        if not self.applicable:
            return {"condition": c.describe(), "probe": c.probe, "service": self.service,
                    "reached": False, "applicable": False,
                    "note": f"not applicable on this stack (only with {c.only_with}, which it does not offer)"}
        out: dict[str, Any] = {"condition": c.describe(), "probe": c.probe, "service": self.service,
                               "reached": self.reached(), "applicable": True}
        if c.probe == "log":
            out.update(matched=self.matched, want=c.matched or 1, lines=self.lines)
        else:
            out.update(url=self.url, baseline=self.baseline, max=self.max, final=self.last,
                       samples=self.samples)
            if c.grew_by is not None:
                out.update(increase=self.increase, want_increase=c.grew_by)
            else:
                out.update(want_max=c.reached)
            if c.probe == "metric" and not self.seen and self.samples:
                out["note"] = (f"no sample named {' or '.join(c.metric_names)} matched on {self.url} "
                               "(counted as 0)")
        if self.errors:
            out["errors"] = self.errors[-5:]
        return out


class TriggerWatch:
    """Watches a trigger's conditions from :meth:`begin` to :meth:`finish`.

    Args:
        conditions: the trigger (all must be reached).
        stack: the running stack (``settings``, ``env``, its logs, and ``spec.capabilities()``).
        every_s: seconds between samples of the numbers.
        capabilities: what the stack offers, for ``only_with``; None: ``stack_capabilities(stack)``.
    """

    def __init__(self, conditions: list[Condition], stack: Any, every_s: float = SAMPLE_EVERY_S,
                 capabilities: set[str] | None = None) -> None:
        have = stack_capabilities(stack) if capabilities is None else capabilities
        self.probes = [_Probe(c, stack, c.applies(have)) for c in conditions]
        self.every_s = every_s
        self._client = httpx.Client(limits=pool_limits(), verify=ssl_context())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finished = False
        self.began_at: float | None = None
        self.finished_at: float | None = None

    def begin(self) -> None:
        """Read every baseline (call before the fault acts)."""
        self.began_at = time.monotonic()
        for p in self.probes:
            p.begin(self._client)

    def start(self) -> None:
        """Sample the numbers every ``every_s`` in a background thread until :meth:`finish`."""
        if self._thread is not None or not any(p.url for p in self.probes):
            return
        self._thread = threading.Thread(target=self._loop, name="trigger-watch", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                if self._finished:
                    return
                for p in self.probes:
                    p.sample(self._client)

    def finish(self) -> dict[str, Any]:
        """Take the final sample (while the fault is still in place), stop sampling, and return
        :meth:`result`. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(READ_TIMEOUT_S * 2)
        with self._lock:
            if not self._finished:
                for p in self.probes:
                    p.sample(self._client)
                    p.finish()
                self._finished = True
                self.finished_at = time.monotonic()
                self._client.close()
        return self.result()

    def result(self) -> dict[str, Any]:
        """``{"reached": bool, "conditions": [...], "window_s": float}``: reached when every
        applicable condition was and at least one applies (``only_with``); with none applicable,
        ``reached`` is False and ``note`` says why."""
        rows = [p.result() for p in self.probes]
        window = (self.finished_at - self.began_at) if self.began_at and self.finished_at else None
        live = [r for r in rows if r["applicable"]]
        out: dict[str, Any] = {"reached": bool(live) and all(r["reached"] for r in live),
                               "conditions": rows, "window_s": window}
        if rows and not live:
            out["note"] = "no condition of this trigger applies on this stack (only_with)"
        return out


def stack_capabilities(stack: Any) -> set[str] | None:
    """What a running stack offers (``stack.spec.capabilities()``); None when it cannot say
    (then every ``only_with`` condition is inapplicable: never counted as reached)."""
    spec = getattr(stack, "spec", None)
    try:
        return set(spec.capabilities()) if spec is not None else None
    except Exception:  # a stand-in stack without a spec
        return None
