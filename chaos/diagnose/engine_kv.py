"""The KV an engine attends over after a load, read from the engine itself (triage step 3 on
the engine's side: "compare cached KV with recomputed KV, layer by layer").

    arm(engine, request_id) ─> the replay runs ─> fetch(engine, request_id) ─> [2, L, T, H]

Only engines that show their KV blocks can be read: the reference engine's ``/debug/kv`` routes
(on unless ``KVCHAOS_ENGINE_DEBUG_ROUTES=0``). vLLM has no API that returns the KV blocks a
request attends over, so on vLLM this step reports that it cannot see it.
"""

from __future__ import annotations

import time

import httpx

NOT_SHOWN = ("the engine shows no KV blocks (no /debug/kv route: vLLM offers no API that returns the KV a "
             "request attends over, and the reference engine hides it with KVCHAOS_ENGINE_DEBUG_ROUTES=0), "
             "so the KV after the load cannot be compared")


class EngineKVError(RuntimeError):
    """The engine did not show the request's KV (the message says why)."""


def arm(engine_url: str, request_id: str, timeout_s: float = 5.0) -> None:
    """Ask the engine to capture ``request_id``'s prompt KV at the end of its prefill.

    Raises:
        EngineKVError: the engine has no such route (:data:`NOT_SHOWN`) or did not answer.
    """
    try:
        r = httpx.post(f"{engine_url.rstrip('/')}/debug/kv/{request_id}", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EngineKVError(f"engine /debug/kv did not answer: {exc}") from exc
    if r.status_code in (404, 405):
        raise EngineKVError(NOT_SHOWN)
    if r.status_code >= 300:
        raise EngineKVError(f"engine /debug/kv answered HTTP {r.status_code}")


def fetch(engine_url: str, request_id: str, timeout_s: float = 10.0):
    """The captured KV of ``request_id`` and what the engine reported it took from caches.

    Returns:
        ``(kv, local_hit_tokens, external_hit_tokens)``; ``kv`` a float32 tensor
        ``[2, num_layers, prompt_tokens, hidden_dim]`` (K then V).

    Raises:
        EngineKVError: not captured (the replay failed before its prefill ended), no route, or
            a body that does not match its declared shape.
    """
    import torch

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = httpx.get(f"{engine_url.rstrip('/')}/debug/kv/{request_id}", timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise EngineKVError(f"engine /debug/kv did not answer: {exc}") from exc
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if r.status_code == 404:
        raise EngineKVError(f"the engine captured no KV of {request_id} (route missing or capture dropped)")
    if r.status_code != 200:
        raise EngineKVError(f"engine /debug/kv/{request_id} answered HTTP {r.status_code}")
    try:
        shape = [int(x) for x in r.headers["x-kv-shape"].split(",")]
        dtype = r.headers.get("x-kv-dtype", "float32")
        local, external = int(r.headers["x-kv-local-hit-tokens"]), int(r.headers["x-kv-external-hit-tokens"])
    except (KeyError, ValueError) as exc:
        raise EngineKVError(f"engine /debug/kv/{request_id}: bad headers ({exc})") from exc
    raw = bytearray(r.content)
    if dtype == "bfloat16":
        kv = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
    elif dtype in ("float32", "float16"):
        kv = torch.frombuffer(raw, dtype=getattr(torch, dtype))
    else:
        raise EngineKVError(f"engine /debug/kv/{request_id}: unknown dtype {dtype!r}")
    n = 1
    for x in shape:
        n *= x
    if kv.numel() != n or len(shape) != 4:
        raise EngineKVError(f"engine /debug/kv/{request_id}: {kv.numel()} values for shape {shape}")
    return kv.reshape(shape).float(), local, external
