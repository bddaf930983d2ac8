"""Polling the stack's leak sources until they read zero or the quiesce deadline passes.

A leak source (x-kvchaos ``leak_sources``) is an HTTP JSON endpoint and a map of reported
names to dotted paths in it, e.g. LMCache's ``GET /status`` field
``storage_manager.l1_manager.read_locked_count`` (LMCache 0.5.6,
``v1/multiprocess/http_server``) or the reference engine's ``/debug/state``. Once the workload
is over and every fault is healed, every field must return to 0: read/write locks, pins,
sessions, staging bytes and the engine's blocks held by requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from chaos.checks.snapshots import LeakError, LeakSample
from chaos.stack.spec import LeakSource


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
    """One reading of a source: ``{field: number or None}`` (None: path missing or not a number).

    Raises:
        httpx.HTTPError: the endpoint failed; ValueError: not JSON.
    """
    r = client.get(source.url)
    r.raise_for_status()
    data = r.json()
    out: dict[str, float | None] = {}
    for name, path in source.fields.items():
        v = dotted(data, path)
        out[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return out


def poll_until_quiet(sources: list[LeakSource], quiesce_s: float, poll_interval_s: float,
                     now: Callable[[], float], timeout_s: float = 5.0
                     ) -> tuple[list[LeakSample], list[LeakError], float]:
    """Poll every source until each reads all-zero (in one poll round) or ``quiesce_s`` passes.

    Args:
        sources: the leak sources.
        quiesce_s: the deadline, seconds from now.
        poll_interval_s: pause between rounds, seconds.
        now: the run clock (seconds since run start) for the sample times.
        timeout_s: HTTP timeout of one reading.

    Returns:
        ``(samples, errors, waited_s)``; the last sample of each source is its final state.
    """
    samples: list[LeakSample] = []
    errors: list[LeakError] = []
    t0 = time.monotonic()
    with httpx.Client(timeout=timeout_s) as client:
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
                if any(v != 0 for v in values.values()):
                    quiet = False
            waited = time.monotonic() - t0
            if quiet or waited >= quiesce_s:
                return samples, errors, waited
            time.sleep(min(poll_interval_s, max(0.0, quiesce_s - waited)))
