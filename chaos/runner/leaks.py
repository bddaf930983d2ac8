"""Polling the stack's leak sources until they are back at their baseline or the quiesce
deadline passes.

A leak source (x-kvchaos ``leak_sources``, chaos/stack/spec.py ``LeakSource``) is an HTTP
endpoint and a map of reported names to values in it:

- ``format: json``: dotted paths in a JSON answer, e.g. LMCache's ``GET /status`` field
  ``storage_manager.l1_manager.read_locked_count`` (LMCache 0.5.6,
  ``v1/multiprocess/http_server``) or the reference engine's ``/debug/state``;
- ``format: prometheus``: series selectors over Prometheus text, e.g. vLLM's
  ``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` on ``/metrics``
  (chaos/prometheus.py reads them with prometheus_client's parser).

Once the workload is over and every fault is healed, every field must return to its baseline:
0 (``baseline: zero``), or at most what it read before the first phase (``baseline:
before_faults``, read by :func:`read_baselines` at the start of the run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from chaos.checks.snapshots import LeakError, LeakSample
from chaos.httppool import pool_limits, ssl_context
from chaos.prometheus import sum_selectors
from chaos.stack.spec import LeakSource

__all__ = ["dotted", "read_source", "read_baselines", "at_baseline", "baseline_of", "poll_until_quiet",
           "leftover_state", "restart_dirty"]


def dotted(data: Any, path: str) -> Any:
    """``data["a"]["b"][0]`` for ``"a.b.0"``; None when any step is missing."""
    cur = data
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def read_source(source: LeakSource, client: httpx.Client) -> dict[str, float | None]:
    """One reading of a source: ``{field: number or None}`` (None: path missing or not a
    number; for Prometheus, no series matched the selector).

    Raises:
        httpx.HTTPError: the endpoint failed; ValueError: not JSON (or not Prometheus text).
    """
    r = client.get(source.url)
    r.raise_for_status()
    if source.format == "prometheus":
        return sum_selectors(r.text, source.fields)
    data = r.json()
    out: dict[str, float | None] = {}
    for name, path in source.fields.items():
        v = dotted(data, path)
        out[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return out


def read_baselines(sources: list[LeakSource], timeout_s: float = 5.0) -> dict[str, dict[str, float | None]]:
    """The reading of every ``baseline: before_faults`` source now (before the first phase).

    Returns:
        ``{source name: {field: value or None}}``; a source that did not answer maps every field
        to None (the leaks check then cannot decide on it and says so).
    """
    out: dict[str, dict[str, float | None]] = {}
    with httpx.Client(timeout=timeout_s, limits=pool_limits(), verify=ssl_context()) as client:
        for src in sources:
            if src.baseline != "before_faults":
                continue
            try:
                out[src.name] = read_source(src, client)
            except (httpx.HTTPError, ValueError):
                out[src.name] = {f: None for f in src.fields}
    return out


def at_baseline(value: float | None, baseline: float | None) -> bool:
    """True when a reading is back. ``baseline`` None means ``baseline: zero``: the value must
    be exactly 0 (a negative lock count is as wrong as a positive one); otherwise the value must
    be at most the baseline (a gauge below what it read before the faults held nothing of this
    run). An unread value is never back."""
    if value is None:
        return False
    return value == 0 if baseline is None else value <= baseline


def baseline_of(source: LeakSource, baselines: Mapping[str, Mapping[str, float | None]],
                field: str) -> float | None:
    """The baseline a field is compared with: None for ``baseline: zero``; the reading before
    the faults for ``before_faults`` (NaN when it could not be read: never at baseline)."""
    if source.baseline != "before_faults":
        return None
    got = baselines.get(source.name, {}).get(field)
    return float("nan") if got is None else got


def poll_until_quiet(sources: list[LeakSource], quiesce_s: float, poll_interval_s: float,
                     now: Callable[[], float], timeout_s: float = 5.0,
                     baselines: Mapping[str, Mapping[str, float | None]] | None = None,
                     ) -> tuple[list[LeakSample], list[LeakError], float]:
    """Poll every source until each reads at its baseline (in one poll round) or ``quiesce_s``
    passes.

    Args:
        sources: the leak sources.
        quiesce_s: the deadline, seconds from now.
        poll_interval_s: pause between rounds, seconds.
        now: the run clock (seconds since run start) for the sample times.
        timeout_s: HTTP timeout of one reading.
        baselines: ``read_baselines``'s answer (``baseline: before_faults`` sources); other
            sources must read 0.

    Returns:
        ``(samples, errors, waited_s)``; the last sample of each source is its final state.
    """
    samples: list[LeakSample] = []
    errors: list[LeakError] = []
    baselines = baselines or {}
    t0 = time.monotonic()
    with httpx.Client(timeout=timeout_s, limits=pool_limits(), verify=ssl_context()) as client:
        while True:
            quiet = True
            for src in sources:
                try:
                    values = read_source(src, client)
                except (httpx.HTTPError, ValueError) as exc:
                    errors.append(LeakError(source=src.name, time=now(), error=f"{type(exc).__name__}: {exc}"))
                    quiet = False
                    continue
                samples.append(LeakSample(source=src.name, time=now(), values=values))
                if not all(at_baseline(v, baseline_of(src, baselines, f)) for f, v in values.items()):
                    quiet = False
            waited = time.monotonic() - t0
            if quiet or waited >= quiesce_s:
                return samples, errors, waited
            time.sleep(min(poll_interval_s, max(0.0, quiesce_s - waited)))


def leftover_state(stack: object) -> dict[str, float]:
    """Leak-source counters of a running stack that are not zero (or could not be read: -1).

    A planted bug may leave LMCache holding read locks and sessions; on a reused stack they
    would fail the *next* cell's ``leaks`` check and credit it with a catch it did not make.

    Args:
        stack: a running Stack (its ``spec.settings.leak_sources``).

    Returns:
        ``{"<source>.<field>": value}`` for every non-zero or unreadable field; empty when clean.
    """
    left: dict[str, float] = {}
    with httpx.Client(timeout=5.0, verify=ssl_context()) as client:
        for source in stack.spec.settings.leak_sources:  # type: ignore[attr-defined]
            try:
                values = read_source(source, client)
            except (httpx.HTTPError, ValueError):
                left[f"{source.name}.*"] = -1.0
                continue
            left.update({f"{source.name}.{k}": v for k, v in values.items() if v is None or v != 0})
    return {k: (-1.0 if v is None else v) for k, v in left.items()}


def restart_dirty(stack: object, say: Callable[[str], None]) -> list[str]:
    """Restart the services of the leak sources that hold something (LMCache before the engine,
    so the engine reconnects to a fresh server); returns the services restarted."""
    left = leftover_state(stack)
    if not left:
        return []
    names = {s.name: s.service for s in stack.spec.settings.leak_sources}  # type: ignore[attr-defined]
    services = sorted({names[k.split(".")[0]] for k in left if names.get(k.split(".")[0])},
                      key=lambda n: (n != stack.spec.settings.lmcache, n))  # type: ignore[attr-defined]
    engine = stack.spec.settings.engine  # type: ignore[attr-defined]
    if services and engine and engine not in services:
        services.append(engine)  # a new LMCache server: the engine must connect afresh too
    say(f"stack not clean ({', '.join(f'{k}={v:g}' for k, v in sorted(left.items()))}): "
        f"restarting {', '.join(services)}")
    for name in services:
        stack.restart(name)  # type: ignore[attr-defined]
    return services
