"""Waiting, after kvchaos restarted or resumed LMCache, until the engine uses it again.

LMCache 0.5.6's MP client (``lmcache.integration.vllm.vllm_multi_process_adapter``) learns of a
restarted server only from its heartbeat: each adapter PINGs the server every
``lmcache.mp.heartbeat_interval`` (the reference engine: ``--lmcache-heartbeat-interval``, 2 s;
vLLM: 10 s) with that interval as the reply timeout, goes to degraded mode (no lookup, no store)
when a PING fails, and on the next PING that succeeds re-registers the worker's KV caches
(``HeartbeatThread._execute``, ``register_recover_callback``). Until then the new server lists
no KV-cache context for the worker and every request is recomputed without LMCache. How long
that takes depends on where the heartbeat was when the server went down, and on the host's load:
a fixed sleep after the restart is a race that a loaded CI runner loses, and the phase after it
then sees no LMCache hit (an inconclusive run, or a false "the engine never reconnected").

:func:`wait_engine_reconnected` replaces that sleep: it polls LMCache's ``/status`` until the
server lists as many registered KV-cache contexts as it did before the restart
(``registered_non_cuda_instance_ids`` and ``registered_gpu_ids``, LMCache's
``EngineDrivenTransferModule.report_status`` / ``LMCacheDrivenTransferModule.report_status``)
and, on an engine that exports ``kvchaos_engine_lmcache_healthy`` (the reference engine), until
the engine has said 1 for ``stable_s`` on end (the scheduler adapter's heartbeat runs apart from
the worker's and can still be in degraded mode when the worker has re-registered). It never
raises and never fails a run: an engine that does not come back within ``timeout_s`` is what the
checks after it are there to judge (e.g. the planted bug ``no-reconnect``).

A restart the heartbeat does not see is never recovered from: when no PING fails (the server was
down between two of them), the client stays "healthy", never re-registers, and every later
store and retrieve is refused by the new server ("non-GPU context not registered (or reaped)";
LMCache issue 4642, fix proposed in PR 4687; kvchaos's finding
scenarios/findings/restart-between-heartbeats.yaml). So when kvchaos itself restarts LMCache
under a running engine only to reconfigure it (``Stack.reconfigure``: the l2_fault_inject
wrapper, a scenario's LMCache variables), it waits with :func:`wait_engine_noticed` between the
stop and the start until the engine reports LMCache unhealthy: the restart the scenario needed,
not the LMCache client bug it did not ask about. (An engine without the health gauge is not
waited for; there the wait after the start reports ``reconnected: False`` instead.)

Neither wait waits on an engine whose LMCache client runs no heartbeat: LMCache 0.5.6 starts an
adapter's heartbeat with its first lookup (scheduler) or store/retrieve (worker), so an engine
that has served nothing through LMCache yet never notices a restart and never re-registers
(LMCache issue 4715). The reference engine says so (``kvchaos_engine_lmcache_heartbeats`` 0):
both waits then end at once with ``heartbeats: 0`` in their result, where they used to run to
their 30 s timeouts and end the same way.
"""
from __future__ import annotations

import time
from typing import Any

import httpx

from chaos.httppool import pool_limits, ssl_context

__all__ = ["registered_contexts", "engine_lmcache_healthy", "engine_lmcache_heartbeats", "wait_engine_reconnected",
           "wait_engine_noticed", "RECONNECT_TIMEOUT_S", "STABLE_S"]

#: Longest wait for the engine to come back after an LMCache restart (s): a few heartbeats of
#: vLLM's 10 s default, and the LMCache server's own start on a loaded host.
RECONNECT_TIMEOUT_S = 30.0
#: How long the engine's health gauge must read 1 without a break (s): a little more than the
#: reference engine's 2 s heartbeat (a PING that was sent to the dead server times out after one
#: interval, so an adapter can still drop to degraded mode that long after the other recovered).
STABLE_S = 2.5
_POLL_S = 0.25
_READ_TIMEOUT_S = 3.0
_GAUGE = "kvchaos_engine_lmcache_healthy"
_HEARTBEATS = "kvchaos_engine_lmcache_heartbeats"


def registered_contexts(lmcache_http: str, client: httpx.Client | None = None) -> int | None:
    """How many KV-cache contexts (engine workers) LMCache's ``/status`` lists as registered.

    Args:
        lmcache_http: base URL of the LMCache server's HTTP API (``--http-port``).

    Returns:
        ``len(registered_non_cuda_instance_ids) + len(registered_gpu_ids)``; None when the API
        does not answer (the server is down or starting) or the document has neither list.
    """
    try:
        r = (client or httpx).get(f"{lmcache_http.rstrip('/')}/status", timeout=_READ_TIMEOUT_S)
        r.raise_for_status()
        status = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    lists = [status.get(k) for k in ("registered_non_cuda_instance_ids", "registered_gpu_ids")]
    if not any(isinstance(v, list) for v in lists):
        return None
    return sum(len(v) for v in lists if isinstance(v, list))


def _engine_gauge(engine_url: str, name: str, client: httpx.Client | None) -> list[float] | None:
    """The values of the engine's gauge ``name``; None when it does not answer or export it."""
    from chaos.prometheus import text_samples

    try:
        r = (client or httpx).get(f"{engine_url.rstrip('/')}/metrics", timeout=_READ_TIMEOUT_S)
        r.raise_for_status()
        samples = text_samples(r.text)
    except (httpx.HTTPError, ValueError):
        return None
    return [v for sample_name, _labels, v in samples if sample_name == name] or None


def engine_lmcache_healthy(engine_url: str, client: httpx.Client | None = None) -> bool | None:
    """The engine's ``kvchaos_engine_lmcache_healthy`` gauge (1: its LMCache client is healthy).

    Returns:
        True or False; None when the engine does not export the gauge or does not answer.
    """
    values = _engine_gauge(engine_url, _GAUGE, client)
    return None if values is None else all(v >= 1 for v in values)


def engine_lmcache_heartbeats(engine_url: str, client: httpx.Client | None = None) -> int | None:
    """The engine's ``kvchaos_engine_lmcache_heartbeats`` gauge: how many of its LMCache
    adapters run a heartbeat (0 to 2; see the module doc).

    Returns:
        The count; None when the engine does not export the gauge (vLLM) or does not answer.
    """
    values = _engine_gauge(engine_url, _HEARTBEATS, client)
    return None if values is None else int(min(values))


def wait_engine_reconnected(stack: Any, contexts_before: int | None, timeout_s: float = RECONNECT_TIMEOUT_S,
                            stable_s: float = STABLE_S) -> dict[str, Any]:
    """Wait until the engine uses a restarted or resumed LMCache again (see the module doc).

    Args:
        stack: the running stack (its ``settings``: ``lmcache_http``, ``engine_url``).
        contexts_before: :func:`registered_contexts` before the restart (None or 0: LMCache's
            registrations are not waited for, only the engine's gauge). With the engine's gauge
            at 1, one registered context is enough (see the comment in the loop).
        timeout_s: the longest wait (s).
        stable_s: how long the engine's gauge must read 1 without a break (s).

    Returns:
        ``{"reconnected": bool, "waited_s": float, "contexts_before": int | None,
        "contexts": int | None, "engine_healthy": bool | None}``; ``reconnected`` False when
        the deadline passed first (``engine_healthy`` None: the engine exports no gauge), or
        at once, with ``"heartbeats": 0`` added, when LMCache lists fewer contexts than wanted
        and the engine runs no heartbeat that could re-register them (module doc). Never raises.
    """
    s = getattr(stack, "settings", None)
    lmcache_http = getattr(s, "lmcache_http", None)
    engine_url = getattr(s, "engine_url", None)
    want = contexts_before or 0
    start = time.monotonic()
    deadline = start + timeout_s
    contexts: int | None = None
    healthy: bool | None = None
    healthy_since: float | None = None
    with httpx.Client(limits=pool_limits(), verify=ssl_context()) as client:
        while True:
            now = time.monotonic()
            contexts = registered_contexts(lmcache_http, client) if lmcache_http else None
            healthy = engine_lmcache_healthy(engine_url, client) if engine_url else None
            # As many contexts as before; or, on an engine whose gauge says healthy, at least one
            # (a context of an engine process that was SIGKILLed earlier stays listed until
            # LMCache reaps it, and the new server never lists it again).
            registered = want == 0 or (contexts is not None and (contexts >= want or (healthy is True and contexts >= 1)))
            if healthy is None:
                stable = True  # nothing to watch on this engine
            elif healthy and registered:
                healthy_since = now if healthy_since is None else healthy_since
                stable = now - healthy_since >= stable_s
            else:
                healthy_since = None
                stable = False
            if registered and stable:
                return {"reconnected": True, "waited_s": round(now - start, 3), "contexts_before": contexts_before,
                        "contexts": contexts, "engine_healthy": healthy}
            if not registered and engine_url and engine_lmcache_heartbeats(engine_url, client) == 0:
                return {"reconnected": False, "waited_s": round(now - start, 3), "contexts_before": contexts_before,
                        "contexts": contexts, "engine_healthy": healthy, "heartbeats": 0}
            if now >= deadline:
                return {"reconnected": False, "waited_s": round(now - start, 3), "contexts_before": contexts_before,
                        "contexts": contexts, "engine_healthy": healthy}
            time.sleep(_POLL_S)


def wait_engine_noticed(stack: Any, timeout_s: float = RECONNECT_TIMEOUT_S) -> dict[str, Any]:
    """With LMCache stopped: wait until the engine's ``kvchaos_engine_lmcache_healthy`` gauge
    reads 0, i.e. its LMCache client saw the outage and will re-register with the next server
    (see the module doc).

    Args:
        stack: the running stack (``settings.engine_url``).
        timeout_s: the longest wait (s); a heartbeat PING's timeout plus one interval suffice.

    Returns:
        ``{"noticed": bool | None, "waited_s": float}``; ``noticed`` None when the engine exports
        no gauge (nothing was waited for); False at once, with ``"heartbeats": 0`` added, when
        the engine runs no heartbeat that could notice (module doc). Never raises.
    """
    engine_url = getattr(getattr(stack, "settings", None), "engine_url", None)
    start = time.monotonic()
    with httpx.Client(limits=pool_limits(), verify=ssl_context()) as client:
        while True:
            now = time.monotonic()
            healthy = engine_lmcache_healthy(engine_url, client) if engine_url else None
            if healthy is None or not healthy:
                return {"noticed": None if healthy is None else True, "waited_s": round(now - start, 3)}
            if engine_lmcache_heartbeats(engine_url, client) == 0:
                return {"noticed": False, "waited_s": round(now - start, 3), "heartbeats": 0}
            if now - start >= timeout_s:
                return {"noticed": False, "waited_s": round(now - start, 3)}
            time.sleep(_POLL_S)
